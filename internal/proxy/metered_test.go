package proxy_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/internal/metrics"
	"github.com/agentenv/agentenv/internal/proxy"
)

// TestMeteredAbort: a proxied exec whose client leaves mid-stream (the
// reverse proxy then panics with http.ErrAbortHandler, as net/http
// expects) is still counted, and leaves nothing in flight.
func TestMeteredAbort(t *testing.T) {
	reg := metrics.New("serve")
	h := proxy.Metered(reg, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		panic(http.ErrAbortHandler)
	}))
	func() {
		defer func() {
			if v := recover(); v != http.ErrAbortHandler {
				t.Errorf("got panic %v, want http.ErrAbortHandler passed on", v)
			}
		}()
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("POST", "/process.Process/Start", nil))
	}()
	rec := httptest.NewRecorder()
	reg.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	for _, want := range []string{
		`agentenv_operations_in_flight{op="exec",role="serve"} 0`,
		`agentenv_operation_duration_seconds_count{op="exec",role="serve"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}
