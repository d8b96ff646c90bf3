package api

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
)

// fakeFleet records the node operations that reached it.
type fakeFleet struct{ calls []string }

func (f *fakeFleet) NodeList(ctx context.Context) (any, error) { return []string{"n1"}, nil }
func (f *fakeFleet) Cordon(ctx context.Context, node, mode string) error {
	f.calls = append(f.calls, mode+" "+node)
	return nil
}
func (f *fakeFleet) Uncordon(ctx context.Context, node string) error {
	f.calls = append(f.calls, "uncordon "+node)
	return nil
}
func (f *fakeFleet) Forget(ctx context.Context, node string) error {
	f.calls = append(f.calls, "forget "+node)
	return nil
}

// Node operations change the fleet itself: an API key (what a training
// job holds) may list nodes but not cordon, drain or forget them.
func TestNodeOperationsNeedTheOperatorKey(t *testing.T) {
	for _, c := range []struct {
		name, operatorKey, key, method, path string
		want                                 int
		reached                              bool
	}{
		{"API key drains", "operator-key-0123456789", "api-key", "POST", "/agentenv/nodes/n1/drain", http.StatusForbidden, false},
		{"API key forgets", "operator-key-0123456789", "api-key", "POST", "/agentenv/nodes/n1/forget", http.StatusForbidden, false},
		{"no operator key configured", "", "api-key", "POST", "/agentenv/nodes/n1/cordon", http.StatusForbidden, false},
		{"no key", "operator-key-0123456789", "", "POST", "/agentenv/nodes/n1/drain", http.StatusUnauthorized, false},
		{"wrong key", "operator-key-0123456789", "guess", "POST", "/agentenv/nodes/n1/drain", http.StatusUnauthorized, false},
		{"operator drains", "operator-key-0123456789", "operator-key-0123456789", "POST", "/agentenv/nodes/n1/drain", http.StatusNoContent, true},
		{"API key lists", "operator-key-0123456789", "api-key", "GET", "/agentenv/nodes", http.StatusOK, false},
		{"operator lists", "operator-key-0123456789", "operator-key-0123456789", "GET", "/agentenv/nodes", http.StatusOK, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := &fakeFleet{}
			h := New(Config{APIKey: "api-key", OperatorKey: c.operatorKey, Fleet: f}).Handler()
			req := httptest.NewRequest(c.method, c.path, nil)
			if c.key != "" {
				req.Header.Set("X-API-Key", c.key)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != c.want {
				t.Fatalf("got HTTP %d (%s), want %d", rec.Code, rec.Body, c.want)
			}
			if reached := len(f.calls) > 0; reached != c.reached {
				t.Fatalf("fleet calls %v, want reached=%v", f.calls, c.reached)
			}
		})
	}
}
