package server

import (
	"net/http"
	"time"

	"agentenv/internal/errdefs"
	"agentenv/internal/metrics"
	"agentenv/internal/sandbox"
)

// NewMetrics returns the Prometheus registry of a role, errors counted by
// their errdefs class.
func NewMetrics(role string) *metrics.Registry {
	reg := metrics.New(role)
	reg.SetCause(func(err error) string { _, code := errdefs.HTTPStatus(err); return code })
	return reg
}

// WithMetrics serves /metrics beside h (without the API key: nothing in
// it is secret) and records every request's route and latency.
func WithMetrics(reg *metrics.Registry, h http.Handler) http.Handler {
	inner := reg.HTTPMiddleware(h, nil)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" && r.Header.Get("E2b-Sandbox-Id") == "" {
			reg.Handler().ServeHTTP(w, r)
			return
		}
		inner.ServeHTTP(w, r)
	})
}

// MeterProxy records the latency of commands (and file calls) proxied to
// envd: what an exec costs as the client sees it.
func MeterProxy(reg *metrics.Registry, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		h.ServeHTTP(w, r)
		if op := metrics.ProxyOp(r); op != metrics.OpPort {
			reg.ObserveOp(op, time.Since(start), nil)
		}
	})
}

// SandboxStates counts a host's sandboxes by state for /metrics.
func SandboxStates(m *sandbox.Manager) func() map[string]int {
	return func() map[string]int {
		out := map[string]int{}
		for _, sb := range m.List(sandbox.Filter{}) {
			out[string(sb.State)]++
		}
		return out
	}
}
