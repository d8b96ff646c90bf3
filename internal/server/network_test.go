package server_test

import (
	"agentenv/internal/childproc"
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

	"agentenv/internal/client"
	"agentenv/internal/testenv"
)

// fakeInternet makes a network namespace standing in for the internet: a
// veth to the host, 10.123.7.2/24 inside, and an HTTP server on port 7777
// there. It returns the server's address. Traffic only ever goes to this
// namespace.
func fakeInternet(t *testing.T) string {
	t.Helper()
	testenv.NeedCommand(t, "ip", "iproute2 (make setup)")
	const ns = "agentenv-test-inet"
	run := func(args ...string) {
		t.Helper()
		if out, err := childproc.CombinedOutput(exec.Command(args[0], args[1:]...)); err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
	}
	exec.Command("ip", "netns", "del", ns).Run()
	exec.Command("ip", "link", "del", "tinet0").Run()
	run("ip", "netns", "add", ns)
	t.Cleanup(func() {
		exec.Command("ip", "link", "del", "tinet0").Run()
		exec.Command("ip", "netns", "del", ns).Run()
	})
	run("ip", "link", "add", "tinet0", "type", "veth", "peer", "name", "tinet1")
	run("ip", "link", "set", "tinet1", "netns", ns)
	run("ip", "addr", "add", "10.123.7.1/24", "dev", "tinet0")
	run("ip", "link", "set", "tinet0", "up")
	run("ip", "-n", ns, "addr", "add", "10.123.7.2/24", "dev", "tinet1")
	run("ip", "-n", ns, "link", "set", "tinet1", "up")
	run("ip", "-n", ns, "link", "set", "lo", "up")
	run("ip", "-n", ns, "route", "add", "default", "via", "10.123.7.1")
	www := t.TempDir()
	os.WriteFile(filepath.Join(www, "index.html"), []byte("hello from the fake internet\n"), 0o644)
	srv := exec.Command("ip", "netns", "exec", ns, "/bin/busybox", "httpd", "-f", "-p", "10.123.7.2:7777", "-h", www)
	if err := childproc.Start(srv); err != nil {
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
	return "10.123.7.2:7777"
}

// canReach reports whether sb can fetch http://addr/ within 3 s.
func canReach(t *testing.T, e *env, sb client.Sandbox, addr string) bool {
	t.Helper()
	res := e.sh(t, sb, fmt.Sprintf("timeout 3 wget -q -O - http://%s/ >/dev/null 2>&1 && echo yes || echo no", addr))
	return strings.TrimSpace(string(res.Stdout)) == "yes"
}

// canConnect reports whether sb can open a TCP connection to addr.
func canConnect(t *testing.T, e *env, sb client.Sandbox, host string, port int) bool {
	t.Helper()
	res := e.sh(t, sb, fmt.Sprintf("timeout 3 nc %s %d </dev/null >/dev/null 2>&1 && echo yes || echo no", host, port))
	return strings.TrimSpace(string(res.Stdout)) == "yes"
}

func TestEgressPolicy(t *testing.T) {
	e := sharedServer(t)
	inet := fakeInternet(t)
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
		{"off but allowed", &off, []string{"10.123.7.0/24"}, nil, true},
		{"on but denied", &on, nil, []string{"10.123.7.2"}, false},
		{"allow wins over deny", &on, []string{"10.123.7.2/32"}, []string{"10.123.0.0/16"}, true},
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
	// The host itself can reach a's server (the proxy does).
	c, err := net.DialTimeout("tcp", net.JoinHostPort(slotA.sandboxIP, "8080"), 3*time.Second)
	if err != nil {
		t.Errorf("host cannot reach sandbox a's server: %v", err)
	} else {
		c.Close()
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
			sb, err := e.client.CreateSandbox(ctx, client.CreateRequest{TemplateID: "busybox", Network: map[string]any{"denyOut": []string{"10.123.0.0/16"}}})
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
	limit := testSlotPool + 4 + len(e.liveSandboxes(t))
	for i := 0; i < 50 && len(namespaces("tst")) > limit; i++ {
		time.Sleep(100 * time.Millisecond)
	}
	after := hostNetworkState(t, "tst")
	ns := namespaces("tst")
	// Warm containers (2 for the ready busybox template) and hot-pool
	// sandboxes (2) hold a slot each.
	if len(ns) > testSlotPool+4+len(e.liveSandboxes(t)) || strings.Contains(after, "slot-rules=[c") {
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
