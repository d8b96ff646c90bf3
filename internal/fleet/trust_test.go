package fleet

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/agentenv/agentenv/internal/api"
	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/fleet/nodepb"
	"github.com/agentenv/agentenv/internal/fleet/secret"
	"github.com/agentenv/agentenv/internal/fleet/store"
	"github.com/agentenv/agentenv/internal/sandbox"
	"github.com/agentenv/agentenv/internal/template"
)

func TestRPCAuth(t *testing.T) {
	a := secret.NewAuth("test-secret-0123456789abcdef")
	req := httptest.NewRequest(http.MethodPost, "http://node/fleet/v1/List", nil)
	if a.Verify(req) {
		t.Fatal("a request without the header verified")
	}
	a.Sign(req)
	if !a.Verify(req) {
		t.Fatal("a signed request did not verify")
	}
	if strings.Contains(req.Header.Get(secret.AuthHeader), "test-secret") {
		t.Fatal("the header carries the secret")
	}
	if secret.NewAuth("another-secret-0123456789").Verify(req) {
		t.Fatal("verified with another secret")
	}
	other := httptest.NewRequest(http.MethodPost, "http://node/fleet/v1/Kill", nil)
	other.Header.Set(secret.AuthHeader, req.Header.Get(secret.AuthHeader))
	if a.Verify(other) {
		t.Fatal("a header made for List verified for Kill")
	}
	old := httptest.NewRequest(http.MethodPost, "http://node/fleet/v1/List", nil)
	ts := time.Now().Add(-2 * secret.Skew).Unix()
	old.Header.Set(secret.AuthHeader, strings.Join([]string{itoa(ts), b64(a.MAC(itoa(ts), "POST", "/fleet/v1/List"))}, "."))
	if a.Verify(old) {
		t.Fatal("a header older than the allowed skew verified")
	}
}

// Whoever reaches etcd without the cluster secret can write keys, but
// nothing written so steers the fleet: a node record with a huge
// capacity, a cordon of the real node and a sandbox record pointing at
// the forged node are ignored, and creates still land on the real node.
func TestForgedRecordsSteerNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded etcd")
	}
	cli := scaleEtcd(t)
	ctx := context.Background()
	real := startScaleNode(t, ctx, cli, "real")

	var evilCalls int
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { evilCalls++; http.Error(w, "evil", 500) }))
	defer evil.Close()
	forge := func(key string, v any) {
		b, _ := json.Marshal(v)
		if _, err := cli.Put(ctx, key, string(b)); err != nil {
			t.Fatal(err)
		}
	}
	forge(store.NodesPrefix+"evil", store.NodeRecord{Name: "evil", Addr: strings.TrimPrefix(evil.URL, "http://"), Capacity: store.Capacity{CPUs: 512, MemoryMB: 1 << 30, FreeMemoryMB: 1 << 30, MaxSandboxes: 1 << 20}})
	forge(store.TemplatePrefix+"busybox/evil", api.TemplateInfo{Template: template.Template{Name: "busybox"}})
	forge(store.CordonPrefix+"real", "cordon")
	forge(store.SandboxPrefix+"victim", store.RecordOf("evil", sandbox.Sandbox{ID: "victim", State: sandbox.StateRunning}))
	// A genuine sealed record moved to another key.
	sealed, _ := scaleSeal.Seal(store.CordonPrefix+"other", store.CordonMark{Node: "other", Mode: "cordon"})
	cli.Put(ctx, store.CordonPrefix+"real", sealed)

	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cache := store.NewCache(cctx, cli, scaleSeal, scaleLog())
	if err := cache.Wait(scaleTimeout(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	remote := NewRemote(cli, cache, scaleSecret, nil, scaleLog())
	defer remote.http.CloseIdleConnections()
	if _, ok := cache.Node("evil"); ok {
		t.Error("a node record written without the secret counts as a live node")
	}
	if cache.Cordoned("real") {
		t.Error("a cordon written without the secret (or moved from another key) cordoned the real node")
	}
	if _, ok := cache.Sandbox("victim"); ok {
		t.Error("a sandbox record written without the secret routes traffic")
	}
	if got := cache.Refused(); got < 4 {
		t.Errorf("cache refused %d records, want the 4 forged keys", got)
	}
	for range 5 {
		sb, err := remote.Create(ctx, sandbox.CreateRequest{Template: "busybox"})
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		if !strings.HasPrefix(sb.ID, "real-") {
			t.Fatalf("create landed on %s, want the real node", sb.ID)
		}
	}
	if evilCalls > 0 || real.creates.Load() != 5 {
		t.Fatalf("the forged node got %d calls, the real one %d creates; want 0 and 5", evilCalls, real.creates.Load())
	}
}

// A second agent with a live node's name (cloned hosts share a host name)
// cannot take the name: its claim fails naming the holder, the holder's
// record stays, and the name is free once the holder's lease ends.
func TestNodeNameIsUnique(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded etcd")
	}
	cli := scaleEtcd(t)
	ctx := context.Background()
	first := NewNode(NodeConfig{Name: "t1", Advertise: "10.0.0.1:3100", Secret: "test-secret-0123456789abcdef", Etcd: cli, Log: scaleLog()})
	second := NewNode(NodeConfig{Name: "t1", Advertise: "10.0.0.2:3100", Secret: "test-secret-0123456789abcdef", Etcd: cli, Log: scaleLog()})
	l1, _ := cli.Grant(ctx, 30)
	l2, _ := cli.Grant(ctx, 30)
	if err := first.claim(ctx, l1.ID); err != nil {
		t.Fatalf("first claim: %v", err)
	}
	err := second.claim(ctx, l2.ID)
	if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "10.0.0.1:3100") {
		t.Fatalf("second claim: %v; want a conflict naming the holder at 10.0.0.1:3100", err)
	}
	if err := second.check(ctx); err == nil || !strings.Contains(err.Error(), "10.0.0.1:3100") {
		t.Fatalf("second's start-up check: %v; want a refusal naming the holder", err)
	}
	cli.Revoke(ctx, l2.ID) // the second stops: the first's record must stay
	resp, _ := cli.Get(ctx, store.NodesPrefix+"t1")
	if len(resp.Kvs) != 1 || clientv3.LeaseID(resp.Kvs[0].Lease) != l1.ID {
		t.Fatalf("after the second stopped, node t1's record is %v, want the first's", resp.Kvs)
	}
	// The first's own next run (same address) takes its record over.
	again := NewNode(NodeConfig{Name: "t1", Advertise: "10.0.0.1:3100", Secret: "test-secret-0123456789abcdef", Etcd: cli, Log: scaleLog()})
	l3, _ := cli.Grant(ctx, 30)
	if err := again.claim(ctx, l3.ID); err != nil {
		t.Fatalf("the same node's next run: %v", err)
	}
	cli.Revoke(ctx, l3.ID)
	l4, _ := cli.Grant(ctx, 30)
	if err := second.claim(ctx, l4.ID); err != nil {
		t.Fatalf("claim once the holder is gone: %v", err)
	}
}

func TestDialRefusesUnauthenticatedEtcd(t *testing.T) {
	for _, c := range []struct {
		urls string
		auth EtcdAuth
		want string
	}{
		{"http://10.0.0.1:2379", EtcdAuth{}, "https://"},
		{"http://10.0.0.1:2379", EtcdAuth{Cert: "c", Key: "k"}, "https://"},
		{"https://10.0.0.1:2379", EtcdAuth{}, "authentication"},
		{"https://10.0.0.1:2379", EtcdAuth{Cert: "c"}, "go together"},
		{"", EtcdAuth{}, "give the etcd"},
	} {
		_, err := Dial(c.urls, c.auth)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Dial(%q, %+v) = %v, want an error saying %q", c.urls, c.auth, err, c.want)
		}
	}
	cli, err := Dial("http://127.0.0.1:1", EtcdAuth{})
	if err != nil {
		t.Fatalf("loopback etcd without authentication (a trial on one host): %v", err)
	}
	cli.Close()
}

// With a CA configured, a node that registered without TLS is never
// called over plain HTTP, whatever its record says.
func TestTLSIsNotTheRecordsChoice(t *testing.T) {
	if _, err := (store.NodeRecord{Name: "n", Addr: "10.0.0.1:3100"}).BaseURL(true); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("plain node with TLS required: %v, want a refusal", err)
	}
	if u, err := (store.NodeRecord{Name: "n", Addr: "10.0.0.1:3100", TLS: true}).BaseURL(true); err != nil || u != "https://10.0.0.1:3100" {
		t.Fatalf("TLS node: %q, %v", u, err)
	}
	c := newNodeClient(store.NodeRecord{Name: "n", Addr: "10.0.0.1:3100"}, true, secret.NewAuth("x"), &http.Client{}, nil)
	if _, err := call(context.Background(), c.rpc.Get, &nodepb.SandboxRef{Id: "i1"}); !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "without TLS") {
		t.Fatalf("call to a plain node with TLS required: %v, want a refusal before any request", err)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }
