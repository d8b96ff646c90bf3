package metrics

import (
	"fmt"
	"regexp"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Classes of agentenv_exec_results_total's result label: how a command
// proxied to envd ended.
const (
	ExecOK      = "ok"      // exit code 0
	ExecNonZero = "nonzero" // exited with another code
	ExecTimeout = "timeout" // its timeout passed and it was killed
	ExecOOM     = "oom"     // it (or a process of its group) was killed for memory
	ExecError   = "error"   // the stream ended in another error (it did not start, ...)
)

// Causes of agentenv_sandbox_ends_total's cause label: why a sandbox
// ended.
const (
	EndKilled  = "killed"  // a client killed it
	EndTimeout = "timeout" // its timeout passed
	EndOOM     = "oom"     // the host's memory cgroup killed it
	EndLost    = "lost"    // it died on its own otherwise, or was gone after a restart
)

// ExecResults and EndCauses are the fixed label values, each shown at 0
// before its first count.
var (
	ExecResults = []string{ExecOK, ExecNonZero, ExecTimeout, ExecOOM, ExecError}
	EndCauses   = []string{EndKilled, EndTimeout, EndOOM, EndLost}
)

// DefaultLabelValues bounds the distinct values of the operator's metadata
// label (SetLabelKey); later values count as OtherLabelValue.
const (
	DefaultLabelValues = 64
	OtherLabelValue    = "other"
)

var labelName = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)

// outcomes counts exec results and sandbox ends, each by its class and the
// value of the operator's metadata label.
type outcomes struct {
	// key is the metadata key whose value labels the counts ("" for none);
	// set once, before the server serves.
	key atomic.Pointer[string]
	max int

	mu   sync.Mutex
	seen map[string]bool
	exec map[[2]string]float64
	ends map[[2]string]float64

	// metadata returns a sandbox's metadata by ID (nil when unknown).
	metadata atomic.Pointer[func(id string) map[string]string]
}

// SetLabelKey makes the value of sandbox metadata key a label (named key)
// on agentenv_exec_results_total and agentenv_sandbox_ends_total: for
// example "run", to tell training runs apart. At most max distinct values
// (DefaultLabelValues when max <= 0) are kept; the rest count as
// OtherLabelValue, so a key with a value per sandbox cannot grow /metrics
// without bound. Call it before the server serves.
func (r *Registry) SetLabelKey(key string, max int) error {
	if r == nil || key == "" {
		return nil
	}
	if !labelName.MatchString(key) || key == "result" || key == "cause" || key == "role" || key[0] == '_' {
		return fmt.Errorf("metrics label key %q cannot be a Prometheus label: use letters, digits and underscores, not starting with a digit or underscore, and not result, cause or role", key)
	}
	if max <= 0 {
		max = DefaultLabelValues
	}
	r.out.mu.Lock()
	r.out.max = max
	r.out.mu.Unlock()
	r.out.key.Store(&key)
	return nil
}

// SetMetadata sets the function that returns a sandbox's metadata by ID,
// for ObserveExec's label.
func (r *Registry) SetMetadata(fn func(id string) map[string]string) {
	if r == nil {
		return
	}
	store(&r.out.metadata, fn)
}

// ObserveExec counts one command's result (one of ExecResults) in
// agentenv_exec_results_total, labelled by sandbox id's metadata.
func (r *Registry) ObserveExec(result, id string) {
	if r == nil {
		return
	}
	var md map[string]string
	if r.out.labelKey() != "" && id != "" {
		if fn := load(&r.out.metadata); fn != nil {
			md = fn(id)
		}
	}
	r.out.add(&r.out.exec, result, md)
}

// ObserveSandboxEnd counts one sandbox's end (cause one of EndCauses) in
// agentenv_sandbox_ends_total, labelled by its metadata md.
func (r *Registry) ObserveSandboxEnd(cause string, md map[string]string) {
	if r == nil {
		return
	}
	r.out.add(&r.out.ends, cause, md)
}

func (o *outcomes) labelKey() string {
	if k := o.key.Load(); k != nil {
		return *k
	}
	return ""
}

func (o *outcomes) add(m *map[[2]string]float64, class string, md map[string]string) {
	key := o.labelKey()
	o.mu.Lock()
	defer o.mu.Unlock()
	v := ""
	if key != "" {
		v = o.bound(md[key])
	}
	if *m == nil {
		*m = map[[2]string]float64{}
	}
	(*m)[[2]string{class, v}]++
}

// bound returns v, or OtherLabelValue once max other values were seen.
// Callers hold o.mu.
func (o *outcomes) bound(v string) string {
	if v == "" || o.seen[v] {
		return v
	}
	if len(o.seen) >= o.max {
		return OtherLabelValue
	}
	if o.seen == nil {
		o.seen = map[string]bool{}
	}
	o.seen[v] = true
	return v
}

// totals are the counts by class, all label values together.
func (o *outcomes) totals() (exec, ends map[string]float64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	sum := func(m map[[2]string]float64) map[string]float64 {
		out := map[string]float64{}
		for k, v := range m {
			out[k[0]] += v
		}
		return out
	}
	return sum(o.exec), sum(o.ends)
}

// outcomeCollector serves the counts. Its label names depend on the
// operator's key, so it describes nothing (an unchecked collector).
type outcomeCollector struct{ o *outcomes }

func (c *outcomeCollector) Describe(chan<- *prometheus.Desc) {}

func (c *outcomeCollector) Collect(ch chan<- prometheus.Metric) {
	key := c.o.labelKey()
	labels := func(class string) []string {
		if key == "" {
			return []string{class}
		}
		return []string{class, key}
	}
	execDesc := prometheus.NewDesc("agentenv_exec_results_total",
		"Commands proxied to envd by how they ended: ok (exit 0), nonzero, timeout (killed at its timeout), oom (killed for memory), error (the stream ended in another error).",
		labels("result"), nil)
	endDesc := prometheus.NewDesc("agentenv_sandbox_ends_total",
		"Sandboxes that ended, by cause: killed (by a client), timeout (its timeout passed), oom (the host's memory cgroup killed it), lost (died on its own otherwise, or gone after a restart). Spares of the hot pool that no client had are not counted.",
		labels("cause"), nil)
	c.o.mu.Lock()
	defer c.o.mu.Unlock()
	emit := func(d *prometheus.Desc, m map[[2]string]float64, classes []string) {
		n := map[[2]string]float64{}
		for _, class := range classes {
			n[[2]string{class, ""}] += 0 // each class shows before its first count
		}
		for k, v := range m {
			n[k] += v
		}
		ks := make([][2]string, 0, len(n))
		for k := range n {
			ks = append(ks, k)
		}
		sort.Slice(ks, func(i, j int) bool { return ks[i][0]+"\x00"+ks[i][1] < ks[j][0]+"\x00"+ks[j][1] })
		for _, k := range ks {
			lv := []string{k[0]}
			if key != "" {
				lv = append(lv, k[1])
			}
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, n[k], lv...)
		}
	}
	emit(execDesc, c.o.exec, ExecResults)
	emit(endDesc, c.o.ends, EndCauses)
}
