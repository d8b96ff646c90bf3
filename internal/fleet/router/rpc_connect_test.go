package router

import (
	"context"
	"errors"
	"fmt"
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

// connectBackend answers Connect for sb1 (resumed) and says sb2 was lost.
type connectBackend struct{ service.Backend }

func (connectBackend) Connect(ctx context.Context, id string, d time.Duration) (sandbox.Sandbox, bool, error) {
	switch id {
	case "sb1":
		return sandbox.Sandbox{ID: id, State: sandbox.StateRunning, AccessToken: "tok", EndAt: time.Now().Add(d).UTC(),
			Network: sandbox.Network{AllowInternet: true, AllowOut: []string{"10.0.0.0/8"}}, Metadata: map[string]string{"k": "v"}}, true, nil
	case "sb2":
		return sandbox.Sandbox{}, false, fmt.Errorf("sandbox %q was lost: its node restarted: %w", id, sandbox.ErrLost)
	}
	return sandbox.Sandbox{}, false, errdefs.NotFound("sandbox %q does not exist", id)
}

// TestRPCConnect: connect crosses the node service whole (the resumed
// flag, the timeout, the sandbox with its token), and a lost sandbox stays
// lost (sandbox.ErrLost, not found) on the API server's side.
func TestRPCConnect(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle(node.ServiceHandler(connectBackend{}))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	c := newNodeClient(store.NodeRecord{Name: "n1", Addr: strings.TrimPrefix(srv.URL, "http://")}, false, secret.NewAuth("x"), srv.Client(), nil)
	ctx := context.Background()
	resp, err := call(ctx, c.rpc.Connect, &nodepb.TimeoutRequest{Id: "sb1", Timeout: nodepb.D(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	sb := nodepb.ToSandbox(resp.GetSandbox())
	if !resp.GetResumed() || sb.ID != "sb1" || sb.AccessToken != "tok" || sb.State != sandbox.StateRunning || sb.Metadata["k"] != "v" ||
		!sb.Network.AllowInternet || len(sb.Network.AllowOut) != 1 || time.Until(sb.EndAt) < 59*time.Minute {
		t.Errorf("got resumed %v, %+v; want sb1 resumed, running, with its token, metadata, network and an hour left", resp.GetResumed(), sb)
	}
	_, err = call(ctx, c.rpc.Connect, &nodepb.TimeoutRequest{Id: "sb2"})
	if !errors.Is(err, sandbox.ErrLost) || !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "was lost") {
		t.Errorf("lost sandbox: got %v, want ErrLost and ErrNotFound with the node's message", err)
	}
	if _, err := call(ctx, c.rpc.Connect, &nodepb.TimeoutRequest{Id: "sb3"}); !errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, sandbox.ErrLost) {
		t.Errorf("unknown sandbox: got %v, want ErrNotFound only", err)
	}
}
