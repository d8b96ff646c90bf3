package server_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/client"
	"github.com/agentenv/agentenv/internal/netns"
	"github.com/agentenv/agentenv/internal/proxy"
	"github.com/agentenv/agentenv/internal/sandbox"
	"github.com/agentenv/agentenv/internal/testenv"
)

// inet is the fake internet of a test: addresses served by an HTTP
// server on port 7777 in a namespace the test made.
type inet struct {
	public    string // a public address (TEST-NET-2)
	private   string // RFC 1918
	metadata  string // the cloud metadata address, link-local
	cgnat     string // shared address space (RFC 6598)
	hostLocal string // 10.123.7.2, on the host's side of the link
}

// fakeInternet makes a network namespace standing in for the internet: a
// veth to the host (10.123.7.1 here, 10.123.7.2 there) and an HTTP server
// on port 7777 there that answers on a public, a private, a link-local
// (169.254.169.254) and a CGNAT address too. The host routes those to the
// namespace only for packets from e's sandbox range (a policy rule), so
// the host's own traffic to them (a real metadata service) is untouched.
// Traffic only ever goes to this namespace.
func fakeInternet(t *testing.T, e *env) inet {
	t.Helper()
	testenv.NeedCommand(t, "ip", "iproute2 (make setup)")
	const ns, table = "agentenv-test-inet", "7120"
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
	}
	cleanup := func() {
		for exec.Command("ip", "rule", "del", "pref", table).Run() == nil {
		}
		exec.Command("ip", "route", "flush", "table", table).Run()
		exec.Command("ip", "link", "del", "tinet0").Run()
		exec.Command("ip", "netns", "del", ns).Run()
	}
	cleanup()
	run("ip", "netns", "add", ns)
	t.Cleanup(cleanup)
	run("ip", "link", "add", "tinet0", "type", "veth", "peer", "name", "tinet1")
	run("ip", "link", "set", "tinet1", "netns", ns)
	run("ip", "addr", "add", "10.123.7.1/24", "dev", "tinet0")
	run("ip", "link", "set", "tinet0", "up")
	run("ip", "-n", ns, "addr", "add", "10.123.7.2/24", "dev", "tinet1")
	run("ip", "-n", ns, "link", "set", "tinet1", "up")
	run("ip", "-n", ns, "link", "set", "lo", "up")
	run("ip", "-n", ns, "route", "add", "default", "via", "10.123.7.1")
	in := inet{public: "198.51.100.7", private: "10.123.9.7", metadata: "169.254.169.254", cgnat: "100.64.7.7", hostLocal: "10.123.7.2"}
	for _, a := range []string{in.public, in.private, in.metadata, in.cgnat} {
		run("ip", "-n", ns, "addr", "add", a+"/32", "dev", "lo")
		run("ip", "route", "add", a+"/32", "via", "10.123.7.2", "dev", "tinet0", "table", table)
	}
	run("ip", "rule", "add", "pref", table, "from", e.cfg.NetworkCIDR, "lookup", table)
	www := t.TempDir()
	os.WriteFile(filepath.Join(www, "index.html"), []byte("hello from the fake internet\n"), 0o644)
	srv := exec.Command("ip", "netns", "exec", ns, "/bin/busybox", "httpd", "-f", "-p", "7777", "-h", www)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	// Wait until it listens (from the host; the host routes to it).
	for i := 0; ; i++ {
		c, err := net.DialTimeout("tcp", "10.123.7.2:7777", time.Second)
		if err == nil {
			c.Close()
			break
		}
		if i > 50 {
			t.Fatalf("fake internet server did not start: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, a := range []*string{&in.public, &in.private, &in.metadata, &in.cgnat, &in.hostLocal} {
		*a = net.JoinHostPort(*a, "7777")
	}
	return in
}

// canReach reports whether sb can fetch http://addr/ within 3 s.
func canReach(t *testing.T, e *env, sb client.Sandbox, addr string) bool {
	t.Helper()
	res := e.sh(t, sb, fmt.Sprintf("timeout 3 wget -q -O - http://%s/ >/dev/null 2>&1 && echo yes || echo no", addr))
	return strings.TrimSpace(string(res.Stdout)) == "yes"
}

// reachable reports which of addrs sb can fetch http://addr/ from within
// 3 s, trying them all at once.
func reachable(t *testing.T, e *env, sb client.Sandbox, addrs []string) map[string]bool {
	t.Helper()
	var script strings.Builder
	for _, a := range addrs {
		fmt.Fprintf(&script, "(timeout 3 wget -q -O - http://%[1]s/ >/dev/null 2>&1 && echo 'yes %[1]s' || echo 'no %[1]s') &\n", a)
	}
	script.WriteString("wait\n")
	res := e.sh(t, sb, script.String())
	got := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(string(res.Stdout)), "\n") {
		if ans, addr, ok := strings.Cut(l, " "); ok {
			got[addr] = ans == "yes"
		}
	}
	if len(got) != len(addrs) {
		t.Fatalf("reachability of %v: got answers %q", addrs, res.Stdout)
	}
	return got
}

// canConnect reports whether sb can open a TCP connection to addr.
func canConnect(t *testing.T, e *env, sb client.Sandbox, host string, port int) bool {
	t.Helper()
	res := e.sh(t, sb, fmt.Sprintf("timeout 3 nc %s %d </dev/null >/dev/null 2>&1 && echo yes || echo no", host, port))
	return strings.TrimSpace(string(res.Stdout)) == "yes"
}

func TestEgressPolicy(t *testing.T) {
	e := sharedServer(t)
	in := fakeInternet(t, e)
	inet := in.public
	off := false
	on := true
	tests := []struct {
		name     string
		internet *bool
		allow    []string
		deny     []string
		want     bool
	}{
		{"default is on", nil, nil, nil, true},
		{"internet off", &off, nil, nil, false},
		{"off but allowed", &off, []string{"198.51.100.0/24"}, nil, true},
		{"on but denied", &on, nil, []string{"198.51.100.7"}, false},
		{"allow wins over deny", &on, []string{"198.51.100.7/32"}, []string{"198.51.100.0/24"}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			body := map[string]any{"templateID": "busybox"}
			if tc.internet != nil {
				body["allow_internet_access"] = *tc.internet
			}
			if tc.allow != nil || tc.deny != nil {
				body["network"] = map[string]any{"allowOut": tc.allow, "denyOut": tc.deny}
			}
			sb := e.createRaw(t, body)
			if got := canReach(t, e, sb, inet); got != tc.want {
				t.Errorf("sandbox reaches the fake internet = %v, want %v", got, tc.want)
			}
		})
	}

	// Changed while running.
	sb := e.create(t, client.CreateRequest{})
	if !canReach(t, e, sb, inet) {
		t.Fatal("default sandbox cannot reach the fake internet")
	}
	status, body := e.rawRequest(t, "PUT", "/sandboxes/"+sb.SandboxID+"/network", testKey, strings.NewReader(`{"allow_internet_access":false}`))
	if status != 204 {
		t.Fatalf("update network: %d %v", status, body)
	}
	if canReach(t, e, sb, inet) {
		t.Error("after turning egress off, the sandbox still reaches the fake internet")
	}
	status, _ = e.rawRequest(t, "PUT", "/sandboxes/"+sb.SandboxID+"/network", testKey, strings.NewReader(`{"allowOut":["not-an-ip"]}`))
	if status != 400 {
		t.Errorf("bad allowOut: status %d, want 400", status)
	}
}

func TestSandboxCannotReachHostOrOthers(t *testing.T) {
	e := sharedServer(t)
	a := e.create(t, client.CreateRequest{})
	b := e.create(t, client.CreateRequest{})
	e.sh(t, a, "mkdir -p /tmp/www && echo a > /tmp/www/index.html && httpd -p 8080 -h /tmp/www")

	// A listener on every address of the host.
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	hostPort := ln.Addr().(*net.TCPAddr).Port
	aInfo, _ := e.client.GetSandbox(context.Background(), a.SandboxID)
	_ = aInfo
	slotB := e.slotOf(t, b.SandboxID)
	slotA := e.slotOf(t, a.SandboxID)
	apiPort := portOf(t, e.api)

	for _, tc := range []struct {
		name string
		host string
		port int
	}{
		{"host listener via the slot's host address", slotB.hostIP, hostPort},
		{"agentenv API via the slot's host address", slotB.hostIP, apiPort},
		{"the sandbox's gateway", "169.254.0.22", hostPort},
		{"another sandbox", slotA.sandboxIP, 8080},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if canConnect(t, e, b, tc.host, tc.port) {
				t.Errorf("sandbox connected to %s:%d", tc.host, tc.port)
			}
		})
	}
	// The server itself reaches a's server (the proxy does), with its
	// socket mark.
	if got, err := e.fetchMarked(t, slotA.sandboxIP, 8080); err != nil || got != "a\n" {
		t.Errorf("the server's dialer cannot reach sandbox a's server: got %q (%v), want %q", got, err, "a\n")
	}
}

// The proxy's dialer must be the manager's marked one.
var _ proxy.Sandboxes = (*sandbox.Manager)(nil)

// markedDialer dials as the server does, with its socket mark.
func (e *env) markedDialer(t *testing.T) *net.Dialer {
	t.Helper()
	m, err := netns.NewManager(e.cfg.NetworkCIDR, e.cfg.NetworkTag)
	if err != nil {
		t.Fatal(err)
	}
	return &net.Dialer{Timeout: 3 * time.Second, Control: m.MarkSocket}
}

// fetchMarked gets http://ip:port/ straight from the sandbox's address
// with the server's dialer, retrying while the server in the sandbox
// starts.
func (e *env) fetchMarked(t *testing.T, ip string, port int) (string, error) {
	t.Helper()
	hc := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DialContext: e.markedDialer(t).DialContext, DisableKeepAlives: true}}
	var err error
	for i := 0; i < 50; i++ {
		var resp *http.Response
		if resp, err = hc.Get(fmt.Sprintf("http://%s/", net.JoinHostPort(ip, fmt.Sprint(port)))); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return string(b), nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return "", err
}

// Only the server (its proxy and manager) opens connections to a
// sandbox's ports: not another user of the host, not a root process
// without the server's socket mark, not another sandbox whatever its
// allowOut says. Replies still flow (the proxy serves the port).
func TestPortsReachableOnlyThroughProxy(t *testing.T) {
	e := sharedServer(t)
	a := e.createRaw(t, map[string]any{"templateID": "busybox", "network": map[string]any{"allowPublicTraffic": false}})
	status, body := e.rawRequest(t, "GET", "/sandboxes/"+a.SandboxID, testKey, nil)
	token, _ := body["trafficAccessToken"].(string)
	if status != 200 || token == "" {
		t.Fatalf("sandbox with private traffic: status %d, no trafficAccessToken in %v", status, body)
	}
	e.sh(t, a, "mkdir -p /tmp/www && echo private > /tmp/www/index.html && httpd -p 8080 -h /tmp/www")
	slotA := e.slotOf(t, a.SandboxID)
	direct := net.JoinHostPort(slotA.sandboxIP, "8080")

	// Positive controls: the server's own dialer and the proxy (with the
	// token) reach the port.
	if got, err := e.fetchMarked(t, slotA.sandboxIP, 8080); err != nil || got != "private\n" {
		t.Fatalf("the server's dialer: got %q (%v), want %q", got, err, "private\n")
	}
	req, _ := http.NewRequest("GET", e.proxy+"/", nil)
	req.Host = fmt.Sprintf("8080-%s.%s", a.SandboxID, strings.TrimPrefix(e.proxy, "http://"))
	req.Header.Set("E2b-Traffic-Access-Token", token)
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Errorf("through the proxy: %v", err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != "private\n" {
			t.Errorf("through the proxy with the token: got %d %q, want 200 %q", resp.StatusCode, b, "private\n")
		}
	}

	t.Run("another host user", func(t *testing.T) {
		testenv.NeedCommand(t, "setpriv", "util-linux")
		testenv.NeedCommand(t, "curl", "curl")
		asNobody := func(args ...string) (string, error) {
			args = append([]string{"--reuid=65534", "--regid=65534", "--clear-groups", "curl", "-s", "-S", "-m", "3"}, args...)
			out, err := exec.Command("setpriv", args...).CombinedOutput()
			return string(out), err
		}
		if out, err := asNobody("http://" + direct + "/"); err == nil || strings.Contains(out, "private") {
			t.Errorf("uid 65534 fetching http://%s/ directly: got %q (err %v), want it refused", direct, out, err)
		}
		// The same user through the proxy, with the token, is served.
		out, err := asNobody("-H", "Host: "+req.Host, "-H", "E2b-Traffic-Access-Token: "+token, e.proxy+"/")
		if err != nil || out != "private\n" {
			t.Errorf("uid 65534 through the proxy: got %q (%v), want %q", out, err, "private\n")
		}
	})
	t.Run("root process without the mark", func(t *testing.T) {
		for _, port := range []string{"8080", "49983"} {
			c, err := net.DialTimeout("tcp", net.JoinHostPort(slotA.sandboxIP, port), 3*time.Second)
			if err == nil {
				c.Close()
				t.Errorf("unmarked connection to %s:%s succeeded, want it refused", slotA.sandboxIP, port)
			}
		}
	})
	t.Run("another sandbox allowed everything", func(t *testing.T) {
		allow := []string{e.cfg.NetworkCIDR, slotA.sandboxIP, slotA.sandboxIP + "/32", "0.0.0.0/0"}
		b := e.createRaw(t, map[string]any{"templateID": "busybox", "network": map[string]any{"allowOut": allow}})
		for _, tc := range []struct {
			host string
			port int
		}{{slotA.sandboxIP, 8080}, {slotA.sandboxIP, 49983}, {slotA.hostIP, portOf(t, e.api)}} {
			if canConnect(t, e, b, tc.host, tc.port) {
				t.Errorf("sandbox with allowOut %v connected to %s:%d", allow, tc.host, tc.port)
			}
		}
		// Also when the policy is changed while running.
		bodyJSON := fmt.Sprintf(`{"allowOut":[%q,%q],"allow_internet_access":false}`, e.cfg.NetworkCIDR, slotA.sandboxIP)
		if status, body := e.rawRequest(t, "PUT", "/sandboxes/"+b.SandboxID+"/network", testKey, strings.NewReader(bodyJSON)); status != 204 {
			t.Fatalf("update network: %d %v", status, body)
		}
		if canConnect(t, e, b, slotA.sandboxIP, 8080) {
			t.Errorf("sandbox with allowOut %s connected to %s:8080", bodyJSON, slotA.sandboxIP)
		}
	})
}

// Default egress keeps a sandbox off the host's networks and the private
// and special ranges (the metadata service included); allowOut opens them
// when it names them, not through a catch-all like 0.0.0.0/0.
func TestDefaultEgressBlocksPrivateNetworks(t *testing.T) {
	e := sharedServer(t)
	in := fakeInternet(t, e)
	blocked := map[string]string{"RFC 1918": in.private, "metadata (169.254.169.254)": in.metadata, "CGNAT": in.cgnat, "RFC 1918 on a host link": in.hostLocal}
	addrs := []string{in.public}
	for _, a := range blocked {
		addrs = append(addrs, a)
	}
	sb := e.create(t, client.CreateRequest{})
	put := func(body string) {
		t.Helper()
		if status, resp := e.rawRequest(t, "PUT", "/sandboxes/"+sb.SandboxID+"/network", testKey, strings.NewReader(body)); status != 204 {
			t.Fatalf("update network %s: %d %v", body, status, resp)
		}
	}
	for _, step := range []struct {
		update          string // PUT body, "" for the default policy
		public, private bool
	}{
		{"", true, false},
		// A catch-all does not name them.
		{`{"allowOut":["0.0.0.0/0"]}`, true, false},
		{`{"allowOut":["10.123.9.7","169.254.169.254/32","100.64.0.0/10","10.123.7.0/24"],"allow_internet_access":false}`, false, true},
	} {
		if step.update != "" {
			put(step.update)
		}
		got := reachable(t, e, sb, addrs)
		if got[in.public] != step.public {
			t.Errorf("policy %q: reaches the public address %s = %v, want %v", step.update, in.public, got[in.public], step.public)
		}
		for name, a := range blocked {
			if got[a] != step.private {
				t.Errorf("policy %q: reaches %s at %s = %v, want %v", step.update, name, a, got[a], step.private)
			}
		}
	}
}

func TestExposedPortThroughProxy(t *testing.T) {
	e := sharedServer(t)
	sb := e.create(t, client.CreateRequest{})
	e.sh(t, sb, "mkdir -p /tmp/www && echo served-from-sandbox > /tmp/www/index.html && httpd -p 8080 -h /tmp/www")
	checkServes(t, e, sb, "served-from-sandbox\n")

	// Fork and restore: every child serves on its own URL.
	e.sh(t, sb, "echo parent > /tmp/www/who.html")
	children, errs, err := e.client.ForkSandbox(context.Background(), sb.SandboxID, 3)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range children {
		if errs[i] != nil {
			t.Fatalf("child %d: %v", i, errs[i])
		}
		t.Cleanup(func() { e.client.KillSandbox(context.Background(), c.SandboxID) })
		e.sh(t, c, fmt.Sprintf("echo child%d > /tmp/www/index.html", i))
	}
	for i, c := range children {
		checkServes(t, e, c, fmt.Sprintf("child%d\n", i))
	}
	checkServes(t, e, sb, "served-from-sandbox\n")
}

// checkServes fetches port 8080 of sb through the proxy, by Host and by
// the E2B headers.
func checkServes(t *testing.T, e *env, sb client.Sandbox, want string) {
	t.Helper()
	proxyHost := strings.TrimPrefix(e.proxy, "http://")
	for _, byHost := range []bool{true, false} {
		req, _ := http.NewRequest("GET", e.proxy+"/", nil)
		if byHost {
			req.Host = fmt.Sprintf("8080-%s.%s", sb.SandboxID, proxyHost)
		} else {
			req.Header.Set("E2b-Sandbox-Id", sb.SandboxID)
			req.Header.Set("E2b-Sandbox-Port", "8080")
		}
		var got string
		for i := 0; i < 50; i++ {
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode == 200 {
					got = string(b)
					break
				}
				got = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, b)
			}
			time.Sleep(50 * time.Millisecond)
		}
		if got != want {
			t.Errorf("sandbox %s port 8080 through the proxy (by host: %v) = %q, want %q", sb.SandboxID, byHost, got, want)
		}
	}
}

func TestManySandboxesLeaveNoNetworkBehind(t *testing.T) {
	e := sharedServer(t)
	ctx := context.Background()
	before := hostNetworkState(t, "tst")
	const n = 50
	ids := make(chan string, n)
	errs := make(chan error, n)
	sem := make(chan struct{}, 8)
	for range n {
		go func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			sb, err := e.client.CreateSandbox(ctx, client.CreateRequest{TemplateID: "busybox", Network: &client.Network{DenyOut: []string{"10.123.0.0/16"}}})
			if err != nil {
				errs <- err
				return
			}
			ids <- sb.SandboxID
			errs <- e.client.KillSandbox(ctx, sb.SandboxID)
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	// Slots are recycled into the pool, not deleted: what remains is at
	// most the pool's ready slots, with no policy rules (a refill may be
	// settling: give it a moment).
	// Hot-pool sandboxes (2 per template) and warm containers (2 for the
	// ready busybox template, more for a while after a larger fork) hold a
	// slot each. Kills answer before their teardown, which a loaded host
	// can stretch past 5 s (CI once saw 16 namespaces against the limit
	// then): wait up to 30 s for the count to come down.
	limit := func() int { return testSlotPool + e.pooledSandboxes() + e.warmContainers() + len(e.liveSandboxes(t)) }
	for deadline := time.Now().Add(30 * time.Second); len(namespaces("tst")) > limit() && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
	}
	after := hostNetworkState(t, "tst")
	ns := namespaces("tst")
	if len(ns) > limit() || strings.Contains(after, "slot-rules=[c") {
		t.Errorf("network left after %d creates and kills (pool keeps %d):\nbefore: %s\nafter:  %s", n, testSlotPool, before, after)
	}
}

func (e *env) liveSandboxes(t *testing.T) []client.Sandbox {
	sbs, err := e.client.ListSandboxes(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return sbs
}

// hostNetworkState summarises the namespaces, interfaces and firewall
// chains of a server's tag.
func hostNetworkState(t *testing.T, tag string) string {
	t.Helper()
	ns := namespaces(tag)
	links, _ := exec.Command("ip", "-br", "link").Output()
	var ours []string
	for _, l := range strings.Split(string(links), "\n") {
		if strings.HasPrefix(l, "ae"+tag+"-") {
			ours = append(ours, strings.Fields(l)[0])
		}
	}
	rules, _ := exec.Command("nft", "list", "table", "inet", "agentenv"+tag).Output()
	var chains []string
	for _, l := range strings.Split(string(rules), "\n") {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "chain slot") || strings.Contains(l, "jump slot") {
			chains = append(chains, l)
		}
	}
	return fmt.Sprintf("namespaces=%v links=%v slot-rules=%v", ns, ours, chains)
}

type slotInfo struct{ hostIP, sandboxIP string }

// slotOf reads a sandbox's network slot from its record on disk.
func (e *env) slotOf(t *testing.T, id string) slotInfo {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(e.dataDir, "sandboxes", id, "sandbox.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		Slot struct {
			HostIP    string `json:"hostIP"`
			SandboxIP string `json:"sandboxIP"`
		} `json:"slot"`
	}
	if err := jsonUnmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	return slotInfo{rec.Slot.HostIP, rec.Slot.SandboxIP}
}

func portOf(t *testing.T, url string) int {
	_, p, err := net.SplitHostPort(strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	var n int
	fmt.Sscan(p, &n)
	return n
}

func TestTrafficToken(t *testing.T) {
	e := sharedServer(t)
	sb := e.createRaw(t, map[string]any{"templateID": "busybox", "network": map[string]any{"allowPublicTraffic": false}})
	var token string
	{
		status, body := e.rawRequest(t, "GET", "/sandboxes/"+sb.SandboxID, testKey, nil)
		token, _ = body["trafficAccessToken"].(string)
		if status != 200 || token == "" {
			t.Fatalf("sandbox with private traffic: status %d, no trafficAccessToken in %v", status, body)
		}
	}
	e.sh(t, sb, "mkdir -p /tmp/www && echo private > /tmp/www/index.html && httpd -p 8080 -h /tmp/www")
	get := func(tok string) int {
		req, _ := http.NewRequest("GET", e.proxy+"/", nil)
		req.Header.Set("E2b-Sandbox-Id", sb.SandboxID)
		req.Header.Set("E2b-Sandbox-Port", "8080")
		if tok != "" {
			req.Header.Set("E2b-Traffic-Access-Token", tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := get(""); got != 403 {
		t.Errorf("without the traffic token: %d, want 403", got)
	}
	if got := get("wrong"); got != 403 {
		t.Errorf("with a wrong traffic token: %d, want 403", got)
	}
	if got := get(token); got != 200 {
		t.Errorf("with the traffic token: %d, want 200", got)
	}
	// envd is exempt (it checks its own access token).
	if res := e.sh(t, sb, "echo ok"); string(res.Stdout) != "ok\n" {
		t.Errorf("envd through the proxy: %q", res.Stdout)
	}
}

// TestWebSocketThroughProxy checks that an HTTP upgrade (what WebSocket
// uses) passes through the proxy both ways: the server in the sandbox
// answers 101 and then echoes bytes.
func TestWebSocketThroughProxy(t *testing.T) {
	e := sharedServer(t)
	sb := e.create(t, client.CreateRequest{})
	e.sh(t, sb, `cat > /tmp/ws.sh <<'X'
#!/bin/sh
while read -r line; do line=$(printf '%s' "$line" | tr -d '\r'); [ -z "$line" ] && break; done
printf 'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n'
exec cat
X
chmod +x /tmp/ws.sh
(nc -ll -p 9001 -e /tmp/ws.sh) >/dev/null 2>&1 </dev/null &`)
	proxyAddr := strings.TrimPrefix(e.proxy, "http://")
	var conn net.Conn
	var status string
	for i := 0; i < 50; i++ {
		c, err := net.DialTimeout("tcp", proxyAddr, 3*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "GET /chat HTTP/1.1\r\nHost: 9001-%s.%s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", sb.SandboxID, proxyAddr)
		buf := make([]byte, 4096)
		n, _ := c.Read(buf)
		status = string(buf[:n])
		if strings.HasPrefix(status, "HTTP/1.1 101") {
			conn = c
			break
		}
		c.Close()
		time.Sleep(100 * time.Millisecond)
	}
	if conn == nil {
		t.Fatalf("no 101 through the proxy; last answer %q", status)
	}
	defer conn.Close()
	// A new bound for the echoes: the upgrade's may be nearly spent, and
	// each echo starts a shell in the sandbox.
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	for _, msg := range []string{"hello\n", "again\n"} {
		if _, err := conn.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, len(msg))
		if _, err := io.ReadFull(conn, buf); err != nil {
			t.Fatalf("read echo: %v", err)
		}
		if string(buf) != msg {
			t.Errorf("echo through the upgraded connection = %q, want %q", buf, msg)
		}
	}
}
