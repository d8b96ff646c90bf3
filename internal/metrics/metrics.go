// Package metrics is agentenv's Prometheus instrumentation: one Registry per
// server role (serve, node, api) serving /metrics, with operation latencies
// and errors by cause, the steps of sandbox boots, operations in flight, HTTP routes, sandboxes by state
// and template, warm and hot pools, the snapshot store, timeout reaps, commands
// by result and sandbox ends by cause, the
// host's CPU and memory, node capacity and fleet nodes. Gauges are read through callbacks at scrape time, so nothing
// has to push.
//
// It is a leaf the sandbox, api, fleet and server packages call: it must not
// import them (nor errdefs; callers pass the error-to-cause mapping in), and a
// nil *Registry must stay usable so tests and callers need not make one.
package metrics

import (
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Operations passed to ObserveOp. The op label is a small fixed set: pass
// one of these, never an ID or a user-supplied string.
const (
	OpCreate        = "create"
	OpKill          = "kill"
	OpExec          = "exec"
	OpPause         = "pause"
	OpResume        = "resume"
	OpSnapshot      = "snapshot"
	OpFork          = "fork"
	OpRestore       = "restore"
	OpTemplateBuild = "template_build"
	OpPlace         = "place"
	// OpFiles and OpPort are the other classes ProxyOp returns.
	OpFiles = "files"
	OpPort  = "port"
)

// DefaultCause is the cause recorded for an error when no Cause function is
// set or it returns "".
const DefaultCause = "error"

// durationBuckets span 1 ms (an exec round trip) to 30 s (a cold create or a
// template build step); slower observations land in +Inf.
var durationBuckets = []float64{
	0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30,
}

// stepBuckets span 100 µs (a record write) to 30 s (a slow start command):
// boot steps are each a part of a create.
var stepBuckets = []float64{
	0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30,
}

// Clocks of agentenv_boot_step_seconds.
const (
	ClockWall = "wall"
	ClockCPU  = "cpu"
)

// Registry holds one server role's metrics. Its methods are safe for
// concurrent use, and every method of a nil *Registry is a no-op.
type Registry struct {
	reg *prometheus.Registry

	opDuration   *prometheus.HistogramVec
	opErrors     *prometheus.CounterVec
	httpRequests *prometheus.CounterVec
	httpDuration *prometheus.HistogramVec
	inFlight     *prometheus.GaugeVec
	bootStep     *prometheus.HistogramVec

	// hist is the live page's history (live.go); start the registry's
	// first reading.
	hist  history
	start reading

	// Callbacks; a nil pointer (or one to a nil func) means "not set".
	cause    atomic.Pointer[func(error) string]
	states   atomic.Pointer[func() []SandboxCount]
	pools    atomic.Pointer[func() Pools]
	capacity atomic.Pointer[func() Capacity]
	nodes    atomic.Pointer[func() []NodeInfo]

	// hideTemplates: see HideTemplateNames.
	hideTemplates atomic.Bool

	// out counts exec results and sandbox ends (outcomes.go).
	out outcomes
}

// New returns a Registry for role ("serve", "node" or "api"), which every
// series carries as the constant label role. It has its own
// prometheus.Registry (not the global default), with Go runtime and process
// collectors.
func New(role string) *Registry {
	r := &Registry{
		reg: prometheus.NewRegistry(),
		opDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "agentenv_operation_duration_seconds",
			Help:    "Duration of sandbox operations (create, exec, snapshot, fork, ...), failed ones included.",
			Buckets: durationBuckets,
		}, []string{"op"}),
		opErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentenv_operation_errors_total",
			Help: "Failed sandbox operations by error cause.",
		}, []string{"op", "cause"}),
		httpRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentenv_http_requests_total",
			Help: "HTTP requests by route and status code.",
		}, []string{"route", "code"}),
		httpDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "agentenv_http_request_duration_seconds",
			Help:    "Duration of HTTP requests by route, until the handler returns (whole stream for streaming responses).",
			Buckets: durationBuckets,
		}, []string{"route"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "agentenv_operations_in_flight",
			Help: "Sandbox operations under way, to set against the host's CPU and memory.",
		}, []string{"op"}),
		bootStep: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "agentenv_boot_step_seconds",
			Help:    "Duration of each step of a sandbox's boot (kind: create, restore, ready, fork, reboot, warm), failed ones included: clock=wall, and clock=cpu for the CPU the sandbox's own processes used where it is known.",
			Buckets: stepBuckets,
		}, []string{"kind", "step", "clock"}),
	}
	r.start = r.read()
	reg := prometheus.WrapRegistererWith(prometheus.Labels{"role": role}, r.reg)
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		r.opDuration, r.opErrors, r.httpRequests, r.httpDuration, r.inFlight, r.bootStep,
		&callbackCollector{r: r}, &outcomeCollector{o: &r.out}, newHostCollector(),
	)
	return r
}

// Handler serves the registry in the Prometheus exposition format, for
// /metrics. A failing collector is logged and left out; the rest is served.
// A nil Registry's handler answers 404.
func (r *Registry) Handler() http.Handler {
	if r == nil {
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "metrics are not enabled on this server", http.StatusNotFound)
		})
	}
	return promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{
		ErrorLog:      slog.NewLogLogger(slog.Default().Handler(), slog.LevelWarn),
		ErrorHandling: promhttp.ContinueOnError,
	})
}

// SetCause sets the function that names an error's cause for
// agentenv_operation_errors_total: a short class such as "not_found" (for
// example the code errdefs.HTTPStatus returns). It must return one of a
// small fixed set of names. nil restores the default, which returns
// DefaultCause.
func (r *Registry) SetCause(fn func(error) string) {
	if r == nil {
		return
	}
	store(&r.cause, fn)
}

// ObserveOp records one operation of duration d: in
// agentenv_operation_duration_seconds{op} whatever the outcome, and, when
// err is not nil, in agentenv_operation_errors_total{op,cause}.
func (r *Registry) ObserveOp(op string, d time.Duration, err error) {
	if r == nil {
		return
	}
	r.opDuration.WithLabelValues(op).Observe(d.Seconds())
	if err != nil {
		r.opErrors.WithLabelValues(op, r.causeOf(err)).Inc()
	}
}

// ObserveBootStep records one step of a sandbox's boot in
// agentenv_boot_step_seconds{kind,step,clock}: its wall time, and its CPU
// time unless cpu < 0 (unknown). kind and step come from small fixed sets
// (the sandbox package's boot kinds and step names).
func (r *Registry) ObserveBootStep(kind, step string, wall, cpu time.Duration) {
	if r == nil {
		return
	}
	r.bootStep.WithLabelValues(kind, step, ClockWall).Observe(wall.Seconds())
	if cpu >= 0 {
		r.bootStep.WithLabelValues(kind, step, ClockCPU).Observe(cpu.Seconds())
	}
}

// Begin counts one operation as in flight in
// agentenv_operations_in_flight{op} until the returned func is called with
// its outcome, which ObserveOp then records. A nil Registry's done is a
// no-op.
func (r *Registry) Begin(op string) (done func(err error)) {
	if r == nil {
		return func(error) {}
	}
	start := time.Now()
	g := r.inFlight.WithLabelValues(op)
	g.Inc()
	return func(err error) {
		g.Dec()
		r.ObserveOp(op, time.Since(start), err)
	}
}

func (r *Registry) causeOf(err error) string {
	if fn := load(&r.cause); fn != nil {
		if c := fn(err); c != "" {
			return c
		}
	}
	return DefaultCause
}

// store sets a callback; a nil fn clears it.
func store[F any](p *atomic.Pointer[F], fn F) {
	p.Store(&fn)
}

// load returns the callback, or the zero (nil) func if none is set.
func load[F any](p *atomic.Pointer[F]) F {
	if fn := p.Load(); fn != nil {
		return *fn
	}
	var zero F
	return zero
}
