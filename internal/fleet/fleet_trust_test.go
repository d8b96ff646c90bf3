package fleet_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/agentenv/agentenv/client"
	"github.com/agentenv/agentenv/internal/fleet/secret"
)

// op is a client with the operator's key on the newest API server.
func (f *fleetEnv) op() *client.Client { return f.ops[len(f.ops)-1] }

// countingListener accepts on addr and counts connections (a stand-in
// for an attacker's node, or a service next to etcd).
func countingListener(t *testing.T, addr string) (string, *atomic.Int64) {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	var n atomic.Int64
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			c.Close()
		}
	}()
	return l.Addr().String(), &n
}

// trustChecks replays the attacks of the trust review against the live
// fleet: each must fail safe.
func (f *fleetEnv) trustChecks(t *testing.T) {
	ctx := context.Background()
	c := f.clients[0]
	eps := strings.Split(f.etcdURL, ",")

	t.Run("etcd refuses clients without a certificate", func(t *testing.T) {
		noCert := f.etcdTLS.Clone()
		noCert.Certificates = nil
		for name, conf := range map[string]*tls.Config{"TLS without a client certificate": noCert} {
			cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 2 * time.Second, Logger: zap.NewNop(), TLS: conf})
			if err == nil {
				cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
				_, err = cli.Get(cctx, "/agentenv/sandboxes/", clientv3.WithPrefix())
				cancel()
				cli.Close()
			}
			if err == nil {
				t.Errorf("%s: etcd answered a range of the sandbox records", name)
			}
		}
		plain := strings.ReplaceAll(f.etcdURL, "https://", "http://")
		out, err := exec.Command("curl", "-sS", "-m", "3", "-X", "POST", strings.Split(plain, ",")[0]+"/v3/kv/range", "-d", `{"key":"L2FnZW50ZW52L3NhbmRib3hlcy8=","range_end":"L2FnZW50ZW52L3NhbmRib3hlcy8w"}`).CombinedOutput()
		if err == nil && strings.Contains(string(out), `"kvs"`) {
			t.Errorf("keyless plain-HTTP range answered: %s", out)
		}
	})

	sb, err := c.CreateSandbox(ctx, client.CreateRequest{TemplateID: "busybox", EnvVars: map[string]string{"SECRET_ENV": "env-value-0123456789"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.KillSandbox(ctx, sb.SandboxID)
	insider, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 2 * time.Second, Logger: zap.NewNop(), TLS: f.etcdTLS})
	if err != nil {
		t.Fatal(err)
	}
	defer insider.Close()

	t.Run("etcd holds no token or env var in clear", func(t *testing.T) {
		resp, err := insider.Get(ctx, "/agentenv/", clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, kv := range resp.Kvs {
			found = found || string(kv.Key) == "/agentenv/sandboxes/"+sb.SandboxID
			for _, secret := range []string{sb.EnvdAccessToken, "env-value-0123456789", f.secret} {
				if secret != "" && strings.Contains(string(kv.Value), secret) {
					t.Errorf("etcd key %s holds %q in clear", kv.Key, secret)
				}
			}
		}
		if !found {
			t.Fatalf("no record of sandbox %s in etcd", sb.SandboxID)
		}
	})

	t.Run("records written without the secret steer nothing", func(t *testing.T) {
		evilAddr, evilConns := countingListener(t, "127.0.0.1:0")
		rec, _ := json.Marshal(map[string]any{"name": "evil", "addr": evilAddr, "capacity": map[string]any{"cpus": 512, "memoryMB": 1 << 30, "freeMemoryMB": 1 << 30, "maxSandboxes": 1 << 20}})
		tmpl, _ := json.Marshal(map[string]any{"name": "busybox", "ready": true})
		victimKey := "/agentenv/sandboxes/" + sb.SandboxID
		orig, err := insider.Get(ctx, victimKey)
		if err != nil || len(orig.Kvs) != 1 {
			t.Fatalf("reading %s: %v", victimKey, err)
		}
		forged := map[string]string{
			"/agentenv/nodes/evil": string(rec), "/agentenv/templates/busybox/evil": string(tmpl),
			"/agentenv/cordon/n1": "cordon", "/agentenv/cordon/n2": "cordon", "/agentenv/cordon/n3": "cordon",
			victimKey: fmt.Sprintf(`{"node":"evil","sandbox":{"sandboxID":%q,"state":"running"}}`, sb.SandboxID),
		}
		for k, v := range forged {
			if _, err := insider.Put(ctx, k, v); err != nil {
				t.Fatal(err)
			}
		}
		defer func() {
			for k := range forged {
				if k != victimKey {
					insider.Delete(ctx, k)
				}
			}
			insider.Put(ctx, victimKey, string(orig.Kvs[0].Value))
		}()
		time.Sleep(time.Second) // the API servers' watches deliver the forgeries
		var made []string
		for i := range 4 {
			s, err := f.clients[i%2].CreateSandbox(ctx, client.CreateRequest{TemplateID: "busybox"})
			if err != nil {
				t.Fatalf("create %d with forged cordons and a forged node in etcd: %v", i, err)
			}
			made = append(made, s.SandboxID)
		}
		for _, id := range made {
			c.KillSandbox(ctx, id)
		}
		if out, err := execOut(ctx, f.clients[1], sb, "echo $SECRET_ENV"); err != nil || out != "env-value-0123456789" {
			t.Fatalf("exec in %s after its record was forged: %q, %v; want the real sandbox", sb.SandboxID, out, err)
		}
		if n := evilConns.Load(); n != 0 {
			t.Fatalf("the forged node got %d connections", n)
		}
		nodes, _ := nodeCounts(ctx, c)
		if _, ok := nodes["evil"]; ok {
			t.Fatal("the forged node is listed")
		}
	})

	t.Run("a captured node request is good once, for itself", func(t *testing.T) {
		auth := secret.NewAuth(f.secret)
		// signed is a node RPC on sandbox id, signed with the cluster
		// secret and captured on the way.
		signed := func(addr, method, id string) *http.Request {
			r, _ := http.NewRequest(http.MethodPost, "https://"+addr+"/agentenv.node.v1.NodeService/"+method, strings.NewReader(fmt.Sprintf(`{"id":%q}`, id)))
			r.Header.Set("Content-Type", "application/json")
			if err := auth.Sign(r); err != nil {
				t.Fatal(err)
			}
			return r
		}
		send := func(r *http.Request, body string) int {
			t.Helper()
			o := r.Clone(ctx)
			o.Body, o.ContentLength = io.NopCloser(strings.NewReader(body)), int64(len(body))
			resp, err := f.certHTTP.Do(o)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return resp.StatusCode
		}
		get := fmt.Sprintf(`{"id":%q}`, sb.SandboxID)
		home := ""
		for _, addr := range []string{"10.231.0.11:3100", "10.231.0.12:3100", "10.231.0.13:3100"} {
			r := signed(addr, "Get", sb.SandboxID)
			if send(r, get) == http.StatusOK {
				home = addr
				if got := send(r, get); got != http.StatusUnauthorized {
					t.Errorf("the same Get replayed to %s: HTTP %d, want 401", addr, got)
				}
			}
		}
		if home == "" {
			t.Fatalf("no node answered a signed Get of sandbox %s", sb.SandboxID)
		}
		// A Kill of a sandbox that does not exist, its body swapped for
		// one naming the live sandbox.
		kill := signed(home, "Kill", "i00000000000000000000")
		if got := send(kill, get); got != http.StatusUnauthorized {
			t.Errorf("a signed Kill with another body: HTTP %d, want 401", got)
		}
		if out, err := execOut(ctx, c, sb, "echo alive"); err != nil || out != "alive" {
			t.Fatalf("sandbox %s after a Kill with a swapped body: %q, %v; want it alive", sb.SandboxID, out, err)
		}
	})

	t.Run("an API key cannot drain a node", func(t *testing.T) {
		err := c.NodeAction(ctx, "n1", "drain")
		if err == nil || !strings.Contains(err.Error(), "operator key") {
			t.Fatalf("drain with an API key: %v, want a refusal naming the operator key", err)
		}
		nodes, _ := nodeCounts(ctx, c)
		if nodes["n1"].Cordoned {
			t.Fatal("n1 is cordoned after a refused drain")
		}
	})

	t.Run("a second node with a live node's name refuses to start", func(t *testing.T) {
		args := append([]string{"node", "--name", "n1", "--etcd", f.etcdURL, "--listen", "127.0.0.1:0",
			"--data-dir", filepath.Join(t.TempDir(), "data"), "--cluster-secret-file", filepath.Join(f.dir, "secret"),
			"--network-cidr", "10.232.240.0/20", "--network-tag", "fz"}, f.etcdFlags()...)
		cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		out, err := exec.CommandContext(cctx, f.bin, args...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "held by the live node at 10.231.0.11:3100") {
			t.Fatalf("second node n1: %v\n%s\nwant a refusal naming the holder", err, out)
		}
		time.Sleep(leaseTTL + time.Second) // past the lease TTL: the real n1 must still be there
		nodes, _ := nodeCounts(ctx, c)
		if !nodes["n1"].Alive {
			t.Fatal("n1 is not alive after a second n1 tried to start")
		}
	})

	t.Run("sandboxes cannot reach etcd whatever allowOut says", func(t *testing.T) {
		// A second address on the bridge, as reachable from the nodes as
		// etcd's: allowed, it answers; etcd's, allowed too, does not.
		sh(t, "ip", "addr", "add", "10.231.0.2/24", "dev", bridge)
		defer quiet("ip", "addr", "del", "10.231.0.2/24", "dev", bridge)
		control, _ := countingListener(t, "10.231.0.2:0")
		etcdHost := strings.TrimPrefix(eps[0], "https://")
		s, err := c.CreateSandbox(ctx, client.CreateRequest{TemplateID: "busybox", Network: &client.Network{AllowOut: []string{bridgeIP + "/32", "10.231.0.2/32"}}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.KillSandbox(ctx, s.SandboxID)
		probe := func(hostport string) string {
			h, p, _ := net.SplitHostPort(hostport)
			out, _ := execOut(ctx, c, s, fmt.Sprintf("nc -w 2 %s %s </dev/null >/dev/null 2>&1 && echo open || echo closed", h, p))
			return out
		}
		if got := probe(control); got != "open" {
			t.Fatalf("a service on %s (allowed by allowOut) is %s from the sandbox: the check below would prove nothing", control, got)
		}
		if got := probe(etcdHost); got != "closed" {
			t.Fatalf("etcd at %s is %s from a sandbox whose allowOut lists its address", etcdHost, got)
		}
	})
}
