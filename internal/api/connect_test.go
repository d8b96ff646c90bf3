package api

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/sandbox"
	"github.com/agentenv/agentenv/internal/service"
)

// connectBackend answers Get and Connect for one sandbox in a given state.
type connectBackend struct {
	service.Backend
	sb      sandbox.Sandbox
	resumed bool
	gotD    *time.Duration
}

func (b connectBackend) Get(ctx context.Context, id string) (sandbox.Sandbox, error) {
	if id != b.sb.ID {
		return sandbox.Sandbox{}, errdefs.NotFound("sandbox %q does not exist", id)
	}
	return b.sb, nil
}

func (b connectBackend) Connect(ctx context.Context, id string, d time.Duration) (sandbox.Sandbox, bool, error) {
	if id != b.sb.ID {
		return sandbox.Sandbox{}, false, errdefs.NotFound("sandbox %q does not exist", id)
	}
	*b.gotD = d
	sb := b.sb
	sb.State = sandbox.StateRunning
	return sb, b.resumed, nil
}

// TestConnectIsOneBackendCall: the handler answers 201 when the backend
// resumed, 200 when not, passes the timeout on, refuses memory: false
// for a sandbox paused with its memory, and 404 for an unknown one.
func TestConnectIsOneBackendCall(t *testing.T) {
	for _, c := range []struct {
		name    string
		state   sandbox.State
		files   bool
		resumed bool
		id      string
		body    string
		want    int
		wantD   time.Duration
	}{
		{"paused: resumed", sandbox.StatePaused, false, true, "s1", `{"timeout": 30}`, http.StatusCreated, 30 * time.Second},
		{"running: extended", sandbox.StateRunning, false, false, "s1", `{"timeout": 30}`, http.StatusOK, 30 * time.Second},
		{"no timeout", sandbox.StateRunning, false, false, "s1", `{}`, http.StatusOK, 0},
		{"memory false, paused with memory", sandbox.StatePaused, false, true, "s1", `{"memory": false}`, http.StatusBadRequest, -1},
		{"memory false, paused with files", sandbox.StatePausedFiles, true, true, "s1", `{"memory": false}`, http.StatusCreated, 0},
		{"unknown", sandbox.StateRunning, false, false, "nope", `{}`, http.StatusNotFound, -1},
	} {
		t.Run(c.name, func(t *testing.T) {
			gotD := time.Duration(-1)
			b := connectBackend{sb: sandbox.Sandbox{ID: "s1", State: c.state}, resumed: c.resumed, gotD: &gotD}
			srv := httptest.NewServer(New(Config{APIKey: "k", Backend: b}).Handler())
			defer srv.Close()
			req, _ := http.NewRequest("POST", srv.URL+"/sandboxes/"+c.id+"/connect", strings.NewReader(c.body))
			req.Header.Set("X-API-Key", "k")
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != c.want {
				t.Errorf("got %d, want %d", resp.StatusCode, c.want)
			}
			if gotD != c.wantD {
				t.Errorf("backend got timeout %v, want %v (-1: not called)", gotD, c.wantD)
			}
		})
	}
}
