package server

import (
	"fmt"
	"net/http"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/metrics"
	"github.com/agentenv/agentenv/internal/sandbox"
)

// The live page's history: a point every LiveInterval, the last LiveKeep
// kept (15 minutes).
const (
	LiveInterval = 5 * time.Second
	LiveKeep     = 180
)

// NewMetrics returns the Prometheus registry of a role, errors counted by
// their errdefs class.
func NewMetrics(role string) *metrics.Registry {
	reg := metrics.New(role)
	reg.SetCause(func(err error) string { _, code := errdefs.HTTPStatus(err); return code })
	return reg
}

// WithMetrics serves /metrics beside h to whoever reaches the listener,
// and records every request's route and latency: for a fleet node's port,
// which only the cluster network reaches. An API's listener uses
// WithKeyedMetrics.
func WithMetrics(reg *metrics.Registry, h http.Handler) http.Handler {
	return WithKeyedMetrics(reg, h, reg.Handler())
}

// WithKeyedMetrics serves /metrics beside h through scrape (reg's handler
// behind a key check: the series count every tenant's sandboxes by
// template) and records every request's route and latency.
func WithKeyedMetrics(reg *metrics.Registry, h, scrape http.Handler) http.Handler {
	inner := reg.HTTPMiddleware(h, nil)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" && r.Header.Get("E2b-Sandbox-Id") == "" {
			scrape.ServeHTTP(w, r)
			return
		}
		inner.ServeHTTP(w, r)
	})
}

// MetricsLabel is the operator's choice of a metadata key whose value
// labels agentenv_exec_results_total and agentenv_sandbox_ends_total
// (--metrics-label-key), and how many distinct values it keeps
// (--metrics-label-values; past them, "other").
type MetricsLabel struct {
	Key    string
	Values int
}

// Apply sets the label on reg, or says why it cannot be one.
func (l MetricsLabel) Apply(reg *metrics.Registry) error {
	if l.Values < 0 {
		return fmt.Errorf("--metrics-label-values %d: give a count, or 0 for the default (%d)", l.Values, metrics.DefaultLabelValues)
	}
	if err := reg.SetLabelKey(l.Key, l.Values); err != nil {
		return fmt.Errorf("--metrics-label-key: %w", err)
	}
	return nil
}

// WatchHost reports a host's sandboxes by state and template, its warm and
// hot pools, its snapshot store and its timeout reaps at every scrape, and
// records the steps of its sandboxes' boots and its sandboxes' ends by
// cause.
func WatchHost(reg *metrics.Registry, h *Host) {
	h.Manager.ObserveBootSteps(reg.ObserveBootStep)
	h.Manager.ObserveEnds(func(cause string, sb sandbox.Sandbox) { reg.ObserveSandboxEnd(cause, sb.Metadata) })
	reg.SetMetadata(func(id string) map[string]string {
		sb, err := h.Manager.Get(id)
		if err != nil {
			return nil
		}
		return sb.Metadata
	})
	reg.SetSandboxes(func() []metrics.SandboxCount { return CountSandboxes(h.Manager.List(sandbox.Filter{})) })
	reg.SetPools(func() metrics.Pools {
		p := h.Manager.Pools()
		for _, t := range h.Templates.List() { // an empty pool shows as 0, not as no series
			p.Warm[t.Name] += 0
			p.Hot[t.Name] += 0
		}
		return metrics.Pools{Warm: p.Warm, Hot: p.Hot, SnapshotBytes: h.Snapshots.StoredBytes(), ReapedByTimeout: p.ReapedByTimeout}
	})
}

// CountSandboxes counts sandboxes by state and template for /metrics.
func CountSandboxes(sbs []sandbox.Sandbox) []metrics.SandboxCount {
	n := map[[2]string]int{}
	for _, sb := range sbs {
		n[[2]string{string(sb.State.E2B()), sb.Template}]++
	}
	out := make([]metrics.SandboxCount, 0, len(n))
	for k, v := range n {
		out = append(out, metrics.SandboxCount{State: k[0], Template: k[1], N: v})
	}
	return out
}
