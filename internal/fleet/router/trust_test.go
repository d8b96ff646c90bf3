package router

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/fleet/nodepb"
	"github.com/agentenv/agentenv/internal/fleet/secret"
	"github.com/agentenv/agentenv/internal/fleet/store"
	"github.com/agentenv/agentenv/internal/sandbox"
	"github.com/agentenv/agentenv/internal/service"
	"github.com/agentenv/agentenv/internal/template"
)

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
	forge(store.TemplatePrefix+"busybox/evil", service.TemplateInfo{Template: template.Template{Name: "busybox"}})
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
