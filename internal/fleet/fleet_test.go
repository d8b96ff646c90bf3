package fleet_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/client"
	"github.com/agentenv/agentenv/internal/runtime/gvisorgo"
	"github.com/agentenv/agentenv/internal/testenv"
)

func TestMain(m *testing.M) {
	gvisorgo.WorkerMain()
	os.Exit(m.Run())
}

func TestFleet(t *testing.T) {
	testenv.NeedRoot(t)
	testenv.NeedRunsc(t)
	testenv.NeedCommand(t, "nsenter", "nodes run in their own network namespaces")
	ctx := context.Background()
	f := &fleetEnv{t: t, dir: t.TempDir()}
	f.bin = testenv.BuildAgentenv(t, t.TempDir())
	f.secret = "fleet-test-secret-0123456789abcdef"
	if err := os.WriteFile(filepath.Join(f.dir, "secret"), []byte(f.secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(f.dir, "operator-key"), []byte(opKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(f.dir, "api-keys"), []byte("alice "+aliceKey+"\nbob "+bobKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f.nodeHTTP, f.certHTTP, f.etcdTLS = writeTLS(t, f.dir)
	f.netSetup(3)
	t.Cleanup(f.reapSandboxes)
	if err := os.MkdirAll(nodeData, 0o700); err != nil {
		t.Fatal(err)
	}
	f.startEtcd()
	for i := 1; i <= 3; i++ {
		f.nodes = append(f.nodes, f.startNode(i))
	}
	f.startAPI(1)
	f.startAPI(2)
	defer f.logs()
	c1, c2 := f.clients[0], f.clients[1]
	f.waitAlive(c1, "n1", "n2", "n3")

	t.Run("node port needs a client certificate and the secret", func(t *testing.T) {
		for _, hc := range []*http.Client{f.nodeHTTP, f.certHTTP} {
			resp, err := hc.Post("https://10.231.0.11:3100/fleet/v1/List", "application/json", strings.NewReader("{}"))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Fatalf("node RPC without a certificate or without the secret's proof: got HTTP %d, want 401", resp.StatusCode)
			}
		}
		resp, err := http.Post("http://10.231.0.11:3100/fleet/v1/List", "application/json", strings.NewReader("{}"))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadRequest {
				t.Fatalf("plain HTTP to a TLS node: got HTTP %d, want 400 (client sent an HTTP request to an HTTPS server)", resp.StatusCode)
			}
		}
	})

	t.Run("trust", func(t *testing.T) { f.trustChecks(t) })

	// 60 sandboxes through both API servers, 6 at a time.
	sbs := make([]client.Sandbox, 60)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 6)
	errs := make(chan error, 60)
	for i := range sbs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			c := f.clients[i%2]
			sb, err := c.CreateSandbox(ctx, client.CreateRequest{TemplateID: "busybox", Timeout: new(int64(900))})
			if err != nil {
				errs <- fmt.Errorf("create %d: %w", i, err)
				return
			}
			sbs[i] = sb
			if out, err := execOut(ctx, f.clients[(i+1)%2], sb, "echo $((40+2))"); err != nil || out != "42" {
				errs <- fmt.Errorf("exec in %s through the other API server: %q, %v", sb.SandboxID, out, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		t.FailNow()
	}
	counts, err := nodeCounts(ctx, c2)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"n1", "n2", "n3"} {
		if counts[n].Sandboxes < 10 {
			t.Errorf("node %s runs %d of the 60 sandboxes, want at least 10 (spread: %v %v %v)", n, counts[n].Sandboxes,
				counts["n1"].Sandboxes, counts["n2"].Sandboxes, counts["n3"].Sandboxes)
		}
	}

	t.Run("Host routing through an API server's proxy", func(t *testing.T) {
		// <port>-<sandboxID>.<domain>, as E2B's sandbox URLs: envd answers.
		req, _ := http.NewRequest(http.MethodGet, f.apiURLs[1][1]+"/health", nil)
		req.Host = "49983-" + sbs[7].SandboxID + ".fleet.test"
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			t.Fatalf("envd /health by Host through api2's proxy: HTTP %d, want 2xx", resp.StatusCode)
		}
	})

	t.Run("HTTPS by host name through either API server, with their shared local CA", func(t *testing.T) {
		pem, err := os.ReadFile(filepath.Join(f.dir, "proxy-ca", "ca.pem"))
		if err != nil {
			t.Fatal(err)
		}
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM(pem)
		for i, addr := range f.apiTLS {
			// The name is what E2B's SDK builds; the connection goes to
			// this API server's HTTPS listener on loopback.
			tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots},
				DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
					return (&net.Dialer{}).DialContext(ctx, network, addr)
				}}
			_, port, _ := net.SplitHostPort(addr)
			url := "https://49983-" + sbs[7].SandboxID + "." + fleetDomain + ":" + port + "/health"
			resp, err := (&http.Client{Transport: tr}).Get(url)
			tr.CloseIdleConnections()
			if err != nil {
				t.Fatalf("api%d: %s: %v", i+1, url, err)
			}
			resp.Body.Close()
			if resp.StatusCode/100 != 2 {
				t.Errorf("api%d: %s: HTTP %d, want 2xx", i+1, url, resp.StatusCode)
			}
		}
		var got struct {
			Domain string `json:"domain"`
		}
		req, _ := http.NewRequest(http.MethodGet, f.apiURLs[0][0]+"/sandboxes/"+sbs[7].SandboxID, nil)
		req.Header.Set("X-API-Key", apiKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		json.NewDecoder(resp.Body).Decode(&got)
		resp.Body.Close()
		if _, port, _ := net.SplitHostPort(f.apiTLS[0]); got.Domain != fleetDomain+":"+port {
			t.Errorf("api1 reports domain %q, want %s:%s", got.Domain, fleetDomain, port)
		}
	})

	t.Run("metrics on every role", func(t *testing.T) {
		for _, tc := range []struct{ url, want string }{
			{f.apiURLs[0][0] + "/metrics", `agentenv_operation_duration_seconds_count{op="create",role="api"}`},
			{f.apiURLs[0][0] + "/metrics", `agentenv_fleet_nodes{role="api",state="alive"} 3`},
			{"https://10.231.0.11:3100/metrics", `agentenv_operation_duration_seconds_count{op="exec",role="node"}`},
			{"https://10.231.0.11:3100/metrics", `agentenv_node_max_sandboxes{role="node"} 100`},
			// Gauges: the fleet's sandboxes by state and
			// template on the API role, pools and stores on the node, the
			// host on both.
			{f.apiURLs[0][0] + "/metrics", `agentenv_sandboxes{role="api",state="running",template="busybox"}`},
			{f.apiURLs[0][0] + "/metrics", `agentenv_host_memory_available_bytes{role="api"}`},
			{f.apiURLs[0][0] + "/metrics", `agentenv_operations_in_flight{op="create",role="api"} 0`},
			{"https://10.231.0.11:3100/metrics", `agentenv_sandboxes{role="node",state="running",template="busybox"}`},
			{"https://10.231.0.11:3100/metrics", `agentenv_snapshot_store_bytes{role="node"}`},
			{"https://10.231.0.11:3100/metrics", `agentenv_sandboxes_reaped_total{role="node"}`},
			{"https://10.231.0.11:3100/metrics", `agentenv_host_cpu_seconds_total{mode="busy",role="node"}`},
			// Outcomes, labelled by --metrics-label-key run: commands on
			// the API role (its proxy), sandbox ends on the node.
			{f.apiURLs[0][0] + "/metrics", `agentenv_exec_results_total{result="ok",role="api",run=""}`},
			{"https://10.231.0.11:3100/metrics", `agentenv_sandbox_ends_total{cause="killed",role="node",run=""}`},
		} {
			// The API role serves its metrics to the fleet's key only (they
			// count every key's sandboxes); the node port needs none.
			req, err := http.NewRequest(http.MethodGet, tc.url, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("X-API-Key", apiKey)
			resp, err := f.nodeHTTP.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var b bytes.Buffer
			b.ReadFrom(resp.Body)
			resp.Body.Close()
			if !strings.Contains(b.String(), tc.want) {
				t.Errorf("%s lacks %s", tc.url, tc.want)
			}
		}
	})

	t.Run("e2b SDK through either API server", func(t *testing.T) {
		node := testenv.NeedCommand(t, "node", "the e2b SDK check needs Node.js")
		dir := filepath.Join(testenv.RepoRoot(), "tests", "e2b")
		if _, err := os.Stat(filepath.Join(dir, "node_modules", "e2b")); err != nil {
			t.Fatalf("tests/e2b/node_modules/e2b missing: make setup installs it (npm ci)")
		}
		for i, u := range f.apiURLs {
			cmd := exec.Command(node, "fleet.mjs")
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "E2B_API_URL="+u[0], "E2B_SANDBOX_URL="+u[1], "E2B_API_KEY="+apiKey)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("e2b SDK through API server %d: %v\n%s", i+1, err, out)
			}
		}
	})

	t.Run("killing an API server loses nothing", func(t *testing.T) {
		// Work goes on through api2 while api1 dies mid-run.
		done := make(chan error, 1)
		go func() {
			for i := range 10 {
				sb := sbs[i]
				if out, err := execOut(ctx, c2, sb, "echo ok"); err != nil || out != "ok" {
					done <- fmt.Errorf("exec in %s through api2: %q %v", sb.SandboxID, out, err)
					return
				}
			}
			done <- nil
		}()
		f.apis[0].stop(syscall.SIGKILL)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		list, err := c2.ListSandboxes(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(list) != 60 {
			t.Fatalf("api2 lists %d sandboxes after api1 died, want 60", len(list))
		}
		// A new API server picks up the whole fleet from etcd.
		f.startAPI(3)
		c3 := f.clients[2]
		eventually(t, 30*time.Second, "api3 lists all 60", func() error {
			l, err := c3.ListSandboxes(ctx, nil)
			if err == nil && len(l) != 60 {
				err = fmt.Errorf("lists %d", len(l))
			}
			return err
		})
		if out, err := execOut(ctx, c3, sbs[59], "echo ok"); err != nil || out != "ok" {
			t.Fatalf("exec through api3: %q %v", out, err)
		}
	})
	c := f.clients[len(f.clients)-1]

	t.Run("one etcd member stopped changes nothing", func(t *testing.T) {
		f.etcd[2].stop(syscall.SIGKILL)
		run := map[string]string{"run": "fleet-etcd"}
		sb, err := c.CreateSandbox(ctx, client.CreateRequest{TemplateID: "busybox", Metadata: run})
		if err != nil {
			t.Fatalf("create with one etcd member down: %v", err)
		}
		// The API role labels a command by its sandbox's metadata from
		// its cache of etcd: wait until the cache has the sandbox.
		eventually(t, 30*time.Second, "the sandbox listed by its metadata", func() error {
			if l, err := c.ListSandboxes(ctx, run); err != nil || len(l) != 1 {
				return fmt.Errorf("listed %d, %v", len(l), err)
			}
			return nil
		})
		if out, err := execOut(ctx, c, sb, "echo ok"); err != nil || out != "ok" {
			t.Fatalf("exec: %q %v", out, err)
		}
		if err := c.KillSandbox(ctx, sb.SandboxID); err != nil {
			t.Fatal(err)
		}
		api := f.apiURLs[len(f.apiURLs)-1][0] + "/metrics"
		eventually(t, 30*time.Second, "the command counted under its run", func() error {
			return metricHas(f.nodeHTTP, api, `agentenv_exec_results_total{result="ok",role="api",run="fleet-etcd"} 1`)
		})
		time.Sleep(leaseTTL + time.Second) // longer than the lease TTL: no node may be lost
		m, err := nodeCounts(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range []string{"n1", "n2", "n3"} {
			if !m[n].Alive {
				t.Errorf("node %s lost after one etcd member stopped", n)
			}
		}
	})

	t.Run("a drained node gets no new sandboxes", func(t *testing.T) {
		if err := f.op().NodeAction(ctx, "n3", "drain"); err != nil {
			t.Fatal(err)
		}
		before, _ := nodeCounts(ctx, c)
		var made []client.Sandbox
		for range 6 {
			sb, err := c.CreateSandbox(ctx, client.CreateRequest{TemplateID: "busybox"})
			if err != nil {
				t.Fatal(err)
			}
			made = append(made, sb)
		}
		after, _ := nodeCounts(ctx, c)
		if after["n3"].Sandboxes != before["n3"].Sandboxes || !after["n3"].Draining {
			t.Errorf("drained n3: %d sandboxes before, %d after 6 creates (draining %v), want no change", before["n3"].Sandboxes, after["n3"].Sandboxes, after["n3"].Draining)
		}
		for _, sb := range made {
			c.KillSandbox(ctx, sb.SandboxID)
		}
		if err := f.op().NodeAction(ctx, "n3", "uncordon"); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("snapshot restored on another node keeps memory", func(t *testing.T) {
		// A failure must not leave nodes cordoned for the subtests after.
		t.Cleanup(func() {
			for _, n := range []string{"n1", "n2", "n3"} {
				f.op().NodeAction(ctx, n, "uncordon")
			}
		})
		for _, n := range []string{"n2", "n3"} {
			f.op().NodeAction(ctx, n, "cordon")
		}
		// A template built on n1 only: n2 copies it (and the snapshot)
		// on first use.
		if _, err := c.BuildTemplate(ctx, client.BuildRequest{Name: "tiny", Busybox: true}, func(client.BuildProgress) {}); err != nil {
			t.Fatalf("build tiny: %v", err)
		}
		sb, err := c.CreateSandbox(ctx, client.CreateRequest{TemplateID: "tiny"})
		if err != nil {
			t.Fatal(err)
		}
		want := holdInMemory(t, c, sb)
		snap, err := c.SnapshotSandbox(ctx, sb.SandboxID, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		f.op().NodeAction(ctx, "n2", "uncordon")
		f.op().NodeAction(ctx, "n1", "cordon")
		before, _ := nodeCounts(ctx, c)
		child, err := c.CreateSandbox(ctx, client.CreateRequest{TemplateID: snap.SnapshotID})
		if err != nil {
			t.Fatalf("restore on another node: %v", err)
		}
		after, _ := nodeCounts(ctx, c)
		if after["n2"].Sandboxes != before["n2"].Sandboxes+1 {
			t.Errorf("restored child not on n2: n2 had %d, has %d", before["n2"].Sandboxes, after["n2"].Sandboxes)
		}
		checkMemory(t, c, child, want)
		c.KillSandbox(ctx, child.SandboxID)
		c.KillSandbox(ctx, sb.SandboxID)
		for _, n := range []string{"n1", "n2", "n3"} {
			f.op().NodeAction(ctx, n, "uncordon")
		}
	})

	t.Run("fork spills over a cordoned parent node", func(t *testing.T) {
		// A failure must not leave nodes cordoned for the subtests after.
		t.Cleanup(func() {
			for _, n := range []string{"n1", "n2", "n3"} {
				f.op().NodeAction(ctx, n, "uncordon")
			}
		})
		f.op().NodeAction(ctx, "n2", "cordon")
		f.op().NodeAction(ctx, "n3", "cordon")
		f.op().NodeAction(ctx, "n1", "uncordon")
		parent, err := c.CreateSandbox(ctx, client.CreateRequest{TemplateID: "busybox"})
		if err != nil {
			t.Fatal(err)
		}
		want := holdInMemory(t, c, parent)
		f.op().NodeAction(ctx, "n2", "uncordon")
		f.op().NodeAction(ctx, "n3", "uncordon")
		f.op().NodeAction(ctx, "n1", "cordon")
		before, _ := nodeCounts(ctx, c)
		kids, kidErrs, err := c.ForkSandbox(ctx, parent.SandboxID, 2)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range kidErrs {
			if e != nil {
				t.Fatalf("fork child: %v", e)
			}
		}
		after, _ := nodeCounts(ctx, c)
		if after["n1"].Sandboxes != before["n1"].Sandboxes || after["n2"].Sandboxes+after["n3"].Sandboxes != before["n2"].Sandboxes+before["n3"].Sandboxes+2 {
			t.Errorf("fork of a sandbox on cordoned n1: children not on n2/n3 (before %d/%d/%d, after %d/%d/%d)",
				before["n1"].Sandboxes, before["n2"].Sandboxes, before["n3"].Sandboxes, after["n1"].Sandboxes, after["n2"].Sandboxes, after["n3"].Sandboxes)
		}
		t.Cleanup(func() {
			for _, kid := range kids {
				c.KillSandbox(ctx, kid.SandboxID)
			}
			c.KillSandbox(ctx, parent.SandboxID)
		})
		for _, kid := range kids {
			checkMemory(t, c, kid, want)
		}
		f.op().NodeAction(ctx, "n1", "uncordon")
	})

	t.Run("named keys see only their own, through either API server", func(t *testing.T) {
		// api1 is dead by now: api2 and api3 serve.
		a2, a3 := f.apiURLs[1], f.apiURLs[len(f.apiURLs)-1]
		alice1, alice2 := client.New(a3[0], a3[1], aliceKey), client.New(a2[0], a2[1], aliceKey)
		bob2 := client.New(a2[0], a2[1], bobKey)
		md := map[string]string{"suite": "fleet-keys"}
		// The parent on n1, then n1 cordoned: the fork's child is placed on
		// another node from the parent's snapshot, and must still be alice's.
		f.op().NodeAction(ctx, "n2", "cordon")
		f.op().NodeAction(ctx, "n3", "cordon")
		parent, err := alice1.CreateSandbox(ctx, client.CreateRequest{TemplateID: "busybox", Metadata: md})
		f.op().NodeAction(ctx, "n2", "uncordon")
		f.op().NodeAction(ctx, "n3", "uncordon")
		if err != nil {
			t.Fatal(err)
		}
		defer c.KillSandbox(ctx, parent.SandboxID)
		f.op().NodeAction(ctx, "n1", "cordon")
		kids, kidErrs, err := alice2.ForkSandbox(ctx, parent.SandboxID, 1)
		f.op().NodeAction(ctx, "n1", "uncordon")
		if err != nil || kidErrs[0] != nil {
			t.Fatalf("alice's fork: %v %v", err, kidErrs)
		}
		defer c.KillSandbox(ctx, kids[0].SandboxID)
		want := []string{parent.SandboxID, kids[0].SandboxID}
		slices.Sort(want)
		deadline := time.Now().Add(30 * time.Second) // etcd's view reaches both API servers
		for {
			var got []string
			if sbs, err := alice1.ListSandboxes(ctx, md); err == nil {
				for _, sb := range sbs {
					got = append(got, sb.SandboxID)
				}
			}
			slices.Sort(got)
			if slices.Equal(got, want) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("alice lists %v through api3, want her parent and its child %v", got, want)
			}
			time.Sleep(100 * time.Millisecond)
		}
		if sbs, err := bob2.ListSandboxes(ctx, md); err != nil || len(sbs) != 0 {
			t.Errorf("bob lists %d of alice's sandboxes (%v), want none", len(sbs), err)
		}
		for _, id := range want {
			if err := bob2.KillSandbox(ctx, id); err == nil || !strings.Contains(err.Error(), "HTTP 404") {
				t.Errorf("bob kills alice's %s: got %v, want 404", id, err)
			}
		}
		if sbs, err := c.ListSandboxes(ctx, md); err != nil || len(sbs) != 2 {
			t.Errorf("the single key lists %d (%v), want both of alice's", len(sbs), err)
		}
	})

	t.Run("a node cut off is reported lost and comes back whole", func(t *testing.T) {
		m, _ := nodeCounts(ctx, c)
		onN3 := m["n3"].Sandboxes
		if onN3 == 0 {
			t.Fatal("n3 runs no sandboxes")
		}
		sh(t, "ip", "link", "set", "aeflh3", "down")
		cutAt := time.Now()
		var lost []client.Sandbox
		eventually(t, 30*time.Second, fmt.Sprintf("n3's sandboxes reported lost (lease TTL %s)", leaseTTL), func() error {
			lost = lost[:0]
			for _, sb := range sbs {
				_, err := c.GetSandbox(ctx, sb.SandboxID)
				var ce *client.Error
				if errors.As(err, &ce) && ce.Status == http.StatusNotFound && strings.Contains(ce.Message, "lost") {
					lost = append(lost, sb)
				} else if err != nil {
					return err
				}
			}
			if len(lost) != onN3 {
				return fmt.Errorf("%d lost, want %d", len(lost), onN3)
			}
			return nil
		})
		t.Logf("n3 cut off: its %d sandboxes reported lost after %s (lease TTL %s)", onN3, time.Since(cutAt).Round(100*time.Millisecond), leaseTTL)
		list, err := c.ListSandboxes(ctx, nil)
		if err != nil || len(list) != 60-onN3 {
			t.Fatalf("list while n3 is cut off: %d sandboxes (%v), want %d", len(list), err, 60-onN3)
		}
		// New creates succeed elsewhere.
		sb, err := c.CreateSandbox(ctx, client.CreateRequest{TemplateID: "busybox"})
		if err != nil {
			t.Fatalf("create while n3 is cut off: %v", err)
		}
		if out, err := execOut(ctx, c, sb, "echo ok"); err != nil || out != "ok" {
			t.Fatalf("exec: %q %v", out, err)
		}
		c.KillSandbox(ctx, sb.SandboxID)
		// One lost sandbox is killed by its user meanwhile: it must not
		// come back.
		if err := c.KillSandbox(ctx, lost[0].SandboxID); err != nil {
			t.Fatalf("kill of a lost sandbox: %v", err)
		}
		sh(t, "ip", "link", "set", "aeflh3", "up")
		f.waitAlive(c, "n3")
		eventually(t, 30*time.Second, "n3's sandboxes back", func() error {
			for _, sb := range lost[1:] {
				if _, err := c.GetSandbox(ctx, sb.SandboxID); err != nil {
					return err
				}
			}
			return nil
		})
		for _, sb := range lost[1:] {
			if out, err := execOut(ctx, c, sb, "echo back"); err != nil || out != "back" {
				t.Fatalf("exec in %s after n3 returned: %q %v", sb.SandboxID, out, err)
			}
		}
		if _, err := c.GetSandbox(ctx, lost[0].SandboxID); err == nil {
			t.Fatalf("sandbox %s killed while n3 was cut off is back", lost[0].SandboxID)
		}
		eventually(t, 30*time.Second, "n3 runs exactly the sandboxes it kept", func() error {
			m, err := nodeCounts(ctx, c)
			if err == nil && m["n3"].Capacity.Sandboxes != onN3-1 {
				err = fmt.Errorf("n3 reports %d sandboxes running, want %d", m["n3"].Capacity.Sandboxes, onN3-1)
			}
			return err
		})
		list, err = c.ListSandboxes(ctx, nil)
		if err != nil || len(list) != 59 {
			t.Fatalf("list after n3 returned: %d sandboxes (%v), want 59", len(list), err)
		}
		seen := map[string]bool{}
		for _, sb := range list {
			if seen[sb.SandboxID] {
				t.Fatalf("sandbox %s listed twice", sb.SandboxID)
			}
			seen[sb.SandboxID] = true
		}
	})

	t.Run("under load through both API servers: nothing fails", func(t *testing.T) {
		// 12 create → exec → kill loops through both live API servers, and
		// one loop forking a parent while another snapshots it.
		apis := []*client.Client{f.clients[1], f.clients[2]}
		deadline := time.Now().Add(15 * time.Second)
		var cycles, failures atomic.Int64
		var mu sync.Mutex
		var firstErrs []string
		fail := func(err error) {
			failures.Add(1)
			mu.Lock()
			if len(firstErrs) < 5 {
				firstErrs = append(firstErrs, err.Error())
			}
			mu.Unlock()
		}
		var wg sync.WaitGroup
		for w := range 12 {
			wg.Go(func() {
				for time.Now().Before(deadline) {
					c := apis[w%2]
					sb, err := c.CreateSandbox(ctx, client.CreateRequest{TemplateID: "busybox"})
					if err != nil {
						fail(fmt.Errorf("create: %w", err))
						continue
					}
					if out, err := execOut(ctx, apis[(w+1)%2], sb, "echo ok"); err != nil || out != "ok" {
						fail(fmt.Errorf("exec %s: %q %v", sb.SandboxID, out, err))
					}
					if err := c.KillSandbox(ctx, sb.SandboxID); err != nil {
						fail(fmt.Errorf("kill %s: %w", sb.SandboxID, err))
					}
					cycles.Add(1)
				}
			})
		}
		parent, err := c.CreateSandbox(ctx, client.CreateRequest{TemplateID: "busybox"})
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			for time.Now().Before(deadline) {
				kids, errs, err := apis[0].ForkSandbox(ctx, parent.SandboxID, 2)
				if err != nil {
					fail(fmt.Errorf("fork: %w", err))
					continue
				}
				for i, kid := range kids {
					if errs[i] != nil {
						fail(fmt.Errorf("fork child: %w", errs[i]))
						continue
					}
					if err := apis[1].KillSandbox(ctx, kid.SandboxID); err != nil {
						fail(fmt.Errorf("kill fork child %s: %w", kid.SandboxID, err))
					}
				}
			}
		})
		wg.Go(func() {
			for time.Now().Before(deadline) {
				sn, err := apis[1].SnapshotSandbox(ctx, parent.SandboxID, "", nil)
				if err != nil {
					fail(fmt.Errorf("snapshot: %w", err))
					continue
				}
				if err := apis[0].DeleteSnapshot(ctx, sn.SnapshotID); err != nil {
					fail(fmt.Errorf("delete snapshot %s: %w", sn.SnapshotID, err))
				}
			}
		})
		wg.Wait()
		if err := c.KillSandbox(ctx, parent.SandboxID); err != nil {
			fail(fmt.Errorf("kill parent: %w", err))
		}
		t.Logf("load: %d create+exec+kill cycles in 15 s at 12 in flight (with forks racing snapshots), %d failures", cycles.Load(), failures.Load())
		if failures.Load() > 0 {
			t.Fatalf("%d failed requests under load, first: %s", failures.Load(), strings.Join(firstErrs, "; "))
		}
		// Kills went through both API servers: this one's list follows the
		// other's within a watch event.
		eventually(t, 30*time.Second, "the 59 sandboxes from before listed after the load", func() error {
			list, err := c.ListSandboxes(ctx, nil)
			if err != nil || len(list) == 59 {
				return err
			}
			known := map[string]bool{}
			for _, sb := range sbs {
				known[sb.SandboxID] = true
			}
			var extra []string
			for _, sb := range list {
				if !known[sb.SandboxID] {
					_, gerr := c.GetSandbox(ctx, sb.SandboxID)
					extra = append(extra, fmt.Sprintf("%s (get: %v)", sb.SandboxID, gerr))
				}
			}
			return fmt.Errorf("%d listed; extra: %s", len(list), strings.Join(extra, ", "))
		})
	})

	t.Run("a restarted node agent adopts its sandboxes; a forgotten node's are gone", func(t *testing.T) {
		m, _ := nodeCounts(ctx, c)
		onN2 := m["n2"].Sandboxes
		// SIGTERM: the agent leaves at once (revokes its lease); its
		// sandboxes keep running and are adopted at the next start.
		f.nodes[1].stop(syscall.SIGTERM)
		f.waitLost(c, "n2")
		f.nodes[1] = f.startNode(2)
		f.waitAlive(c, "n2")
		eventually(t, 30*time.Second, "n2 adopted its sandboxes", func() error {
			m, err := nodeCounts(ctx, c)
			if err == nil && (m["n2"].Sandboxes != onN2 || m["n2"].Capacity.Sandboxes != onN2) {
				err = fmt.Errorf("n2: %d records, %d running, want %d", m["n2"].Sandboxes, m["n2"].Capacity.Sandboxes, onN2)
			}
			return err
		})
		// Stopped again and forgotten: its records go, with the reason.
		var onN2IDs []string
		for _, sb := range sbs {
			if _, err := c.GetSandbox(ctx, sb.SandboxID); err == nil {
				onN2IDs = append(onN2IDs, sb.SandboxID)
			}
		}
		f.nodes[1].stop(syscall.SIGTERM)
		f.waitLost(c, "n2")
		if err := f.op().NodeAction(ctx, "n2", "forget"); err != nil {
			t.Fatalf("forget n2: %v", err)
		}
		if err := f.op().NodeAction(ctx, "n1", "forget"); err == nil {
			t.Fatal("forget of a live node: got no error, want 409")
		}
		gone := 0
		for _, id := range onN2IDs {
			_, err := c.GetSandbox(ctx, id)
			var ce *client.Error
			if errors.As(err, &ce) && ce.Status == http.StatusNotFound && strings.Contains(ce.Message, "removed from the fleet") {
				gone++
			}
		}
		if gone != onN2 {
			t.Fatalf("%d of n2's %d sandboxes answer 404 \"removed from the fleet\", want all", gone, onN2)
		}
		// Back again: it runs nothing nobody wants.
		f.nodes[1] = f.startNode(2)
		f.waitAlive(c, "n2")
		eventually(t, 30*time.Second, "n2 killed its unrecorded sandboxes", func() error {
			m, err := nodeCounts(ctx, c)
			if err == nil && m["n2"].Capacity.Sandboxes != 0 {
				err = fmt.Errorf("n2 runs %d", m["n2"].Capacity.Sandboxes)
			}
			return err
		})
	})

	// Kill everything; every node ends with none.
	list, _ := c.ListSandboxes(ctx, nil)
	for _, sb := range list {
		if err := c.KillSandbox(ctx, sb.SandboxID); err != nil {
			t.Errorf("kill %s: %v", sb.SandboxID, err)
		}
	}
	eventually(t, 30*time.Second, "all nodes empty", func() error {
		m, err := nodeCounts(ctx, c)
		if err != nil {
			return err
		}
		for _, n := range m {
			if n.Alive && n.Capacity.Sandboxes != 0 {
				return fmt.Errorf("node %s still runs %d", n.Name, n.Capacity.Sandboxes)
			}
		}
		return nil
	})
}

// metricHas says why url's /metrics (read with the fleet's key) lacks the
// line want, or nil.
func metricHas(hc *http.Client, url, want string) error {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("X-API-Key", apiKey)
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	if !strings.Contains(b.String(), want+"\n") {
		return fmt.Errorf("%s has no line %s", url, want)
	}
	return nil
}
