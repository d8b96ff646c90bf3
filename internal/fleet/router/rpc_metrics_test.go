package router

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/fleet/node"
	"github.com/agentenv/agentenv/internal/fleet/nodepb"
	"github.com/agentenv/agentenv/internal/fleet/secret"
	"github.com/agentenv/agentenv/internal/fleet/store"
	"github.com/agentenv/agentenv/internal/sandbox"
	"github.com/agentenv/agentenv/internal/service"
)

// metricsBackend answers Metrics only (the rest of service.Backend is nil).
type metricsBackend struct {
	service.Backend
	m map[string]sandbox.Metric
}

func (b metricsBackend) Metrics(ctx context.Context, id string) (sandbox.Metric, error) {
	m, ok := b.m[id]
	if !ok {
		return m, errdefs.NotFound("sandbox %q does not exist", id)
	}
	return m, nil
}

// TestRPCMetrics: a sample crosses the node RPC whole, and "not found"
// stays not found (the API answers 404, the SDK's SandboxNotFoundError).
func TestRPCMetrics(t *testing.T) {
	want := sandbox.Metric{Timestamp: time.Date(2026, 12, 1, 4, 0, 0, 123, time.UTC), CPUCount: 2, CPUUsedPct: 12.5,
		MemUsed: 1 << 20, MemTotal: 512 << 20, MemCache: 4096, DiskUsed: 15 << 20, DiskTotal: 527 << 20}
	b := metricsBackend{m: map[string]sandbox.Metric{"sb1": want}}
	mux := http.NewServeMux()
	mux.Handle(node.ServiceHandler(b))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	c := newNodeClient(store.NodeRecord{Name: "n1", Addr: strings.TrimPrefix(srv.URL, "http://")}, false, secret.NewAuth("x"), srv.Client(), nil)
	resp, err := call(context.Background(), c.rpc.Metrics, &nodepb.SandboxRef{Id: "sb1"})
	if err != nil {
		t.Fatal(err)
	}
	got := nodepb.ToMetric(resp)
	if !got.Timestamp.Equal(want.Timestamp) {
		t.Errorf("got timestamp %v, want %v", got.Timestamp, want.Timestamp)
	}
	got.Timestamp = want.Timestamp
	if got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if _, err := call(context.Background(), c.rpc.Metrics, &nodepb.SandboxRef{Id: "gone"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unknown sandbox: got %v, want ErrNotFound", err)
	}
}
