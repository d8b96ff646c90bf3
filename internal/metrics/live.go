package metrics

import (
	"context"
	"math"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/procfs"
)

// LiveOps are the operations whose latency the live page charts.
var LiveOps = []string{OpCreate, OpExec, OpFork}

// OpPoint is the operations of one kind that ended in an interval.
type OpPoint struct {
	N int64 `json:"n"`
	// P50 and P95 are in seconds, interpolated within the histogram's
	// buckets as Prometheus's histogram_quantile does; 0 when N is 0.
	P50 float64 `json:"p50"`
	P95 float64 `json:"p95"`
}

// Point is one interval of the live history.
type Point struct {
	At  time.Time          `json:"t"`
	Ops map[string]OpPoint `json:"ops"`
	// CPUBusy is the host's busy share of its CPUs over the interval, 0–1.
	CPUBusy float64 `json:"cpuBusy"`
	// MemUsed is the host's memory not available (total - MemAvailable).
	MemUsed  int64 `json:"memUsed"`
	MemTotal int64 `json:"memTotal"`
	// InFlight is the operations under way at the interval's end.
	InFlight int `json:"inFlight"`
	// Exec counts the commands that ended in the interval by result
	// (ExecResults), Ends the sandboxes that ended by cause (EndCauses):
	// a rollout's rates.
	Exec map[string]int64 `json:"exec"`
	Ends map[string]int64 `json:"ends"`
}

// ErrorCount is how many operations of a kind failed with a cause.
type ErrorCount struct {
	Op    string `json:"op"`
	Cause string `json:"cause"`
	N     int64  `json:"n"`
}

// Live is what the live page shows of a role's registry.
type Live struct {
	// History is oldest first; its last point covers the time since the
	// last sample, up to now.
	History []Point      `json:"history"`
	Errors  []ErrorCount `json:"errors"`
}

// history keeps the last points of a Registry (RunHistory) and the
// cumulative readings the next point is the difference from.
type history struct {
	mu     sync.Mutex
	points []Point
	keep   int
	prev   reading
}

// reading is the cumulative state at one moment.
type reading struct {
	at      time.Time
	buckets map[string][]uint64 // per op, cumulative counts per bucket (+Inf last)
	busy    float64             // host CPU seconds
	total   float64
	// exec and ends are the outcome counts by class, all label values
	// together.
	exec, ends map[string]float64
}

// RunHistory samples the registry every interval into the live history,
// keeping the last keep points, until ctx ends.
func (r *Registry) RunHistory(ctx context.Context, every time.Duration, keep int) {
	if r == nil {
		return
	}
	r.hist.mu.Lock()
	r.hist.keep = keep
	if r.hist.prev.at.IsZero() {
		r.hist.prev = r.start // the first interval counts from the start
	}
	r.hist.mu.Unlock()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := r.read()
		r.hist.mu.Lock()
		r.hist.points = append(r.hist.points, r.point(r.hist.prev, now))
		if n := len(r.hist.points) - r.hist.keep; n > 0 {
			r.hist.points = append(r.hist.points[:0], r.hist.points[n:]...)
		}
		r.hist.prev = now
		r.hist.mu.Unlock()
	}
}

// Live returns the history, with a last point from the last sample (or
// the registry's start) to now, and the errors by cause so far.
func (r *Registry) Live() Live {
	if r == nil {
		return Live{}
	}
	now := r.read()
	r.hist.mu.Lock()
	prev := r.hist.prev
	if prev.at.IsZero() {
		prev = r.start
	}
	out := Live{History: append(make([]Point, 0, len(r.hist.points)+1), r.hist.points...)}
	r.hist.mu.Unlock()
	out.History = append(out.History, r.point(prev, now))

	ch := make(chan prometheus.Metric, 64)
	go func() { r.opErrors.Collect(ch); close(ch) }()
	for m := range ch {
		var d dto.Metric
		if m.Write(&d) != nil {
			continue
		}
		ec := ErrorCount{N: int64(d.GetCounter().GetValue())}
		for _, l := range d.GetLabel() {
			switch l.GetName() {
			case "op":
				ec.Op = l.GetValue()
			case "cause":
				ec.Cause = l.GetValue()
			}
		}
		out.Errors = append(out.Errors, ec)
	}
	sort.Slice(out.Errors, func(i, j int) bool { return out.Errors[i].N > out.Errors[j].N })
	return out
}

// read takes the cumulative state now.
func (r *Registry) read() reading {
	rd := reading{at: time.Now(), buckets: map[string][]uint64{}}
	for _, op := range LiveOps {
		var d dto.Metric
		if err := r.opDuration.WithLabelValues(op).(prometheus.Metric).Write(&d); err != nil {
			continue
		}
		h := d.GetHistogram()
		counts := make([]uint64, 0, len(h.GetBucket())+1)
		for _, b := range h.GetBucket() {
			counts = append(counts, b.GetCumulativeCount())
		}
		rd.buckets[op] = append(counts, h.GetSampleCount())
	}
	rd.exec, rd.ends = r.out.totals()
	if fs, err := procfs.NewDefaultFS(); err == nil {
		if st, err := fs.Stat(); err == nil {
			busy, idle := cpuTimes(st.CPUTotal)
			rd.busy, rd.total = busy, busy+idle
		}
	}
	return rd
}

// point is the interval between two readings, with the host's memory and
// the operations in flight now.
func (r *Registry) point(a, b reading) Point {
	p := Point{At: b.at.UTC(), Ops: map[string]OpPoint{}, Exec: deltas(ExecResults, a.exec, b.exec), Ends: deltas(EndCauses, a.ends, b.ends)}
	for _, op := range LiveOps {
		cur := b.buckets[op]
		delta := make([]uint64, len(cur))
		for i := range cur {
			delta[i] = cur[i]
			if i < len(a.buckets[op]) {
				delta[i] -= min(a.buckets[op][i], cur[i])
			}
		}
		p.Ops[op] = opPoint(delta)
	}
	if dt := b.total - a.total; dt > 0 {
		p.CPUBusy = math.Min(math.Max((b.busy-a.busy)/dt, 0), 1)
	}
	if fs, err := procfs.NewDefaultFS(); err == nil {
		if mi, err := fs.Meminfo(); err == nil && mi.MemTotalBytes != nil && mi.MemAvailableBytes != nil {
			p.MemTotal = int64(*mi.MemTotalBytes)
			p.MemUsed = p.MemTotal - int64(*mi.MemAvailableBytes)
		}
	}
	ch := make(chan prometheus.Metric, 16)
	go func() { r.inFlight.Collect(ch); close(ch) }()
	for m := range ch {
		var d dto.Metric
		if m.Write(&d) == nil {
			p.InFlight += int(d.GetGauge().GetValue())
		}
	}
	return p
}

// deltas is b - a for each class.
func deltas(classes []string, a, b map[string]float64) map[string]int64 {
	out := make(map[string]int64, len(classes))
	for _, c := range classes {
		out[c] = int64(max(b[c]-a[c], 0))
	}
	return out
}

// opPoint reads the count, p50 and p95 from cumulative bucket counts
// over durationBuckets (the last count is the total, +Inf included).
func opPoint(cum []uint64) OpPoint {
	if len(cum) == 0 || cum[len(cum)-1] == 0 {
		return OpPoint{}
	}
	n := cum[len(cum)-1]
	return OpPoint{N: int64(n), P50: quantile(0.5, cum), P95: quantile(0.95, cum)}
}

func quantile(q float64, cum []uint64) float64 {
	n := float64(cum[len(cum)-1])
	rank := q * n
	lower, below := 0.0, 0.0
	for i, c := range cum[:len(cum)-1] {
		upper := durationBuckets[i]
		if float64(c) >= rank {
			if in := float64(c) - below; in > 0 {
				return lower + (upper-lower)*(rank-below)/in
			}
			return upper
		}
		lower, below = upper, float64(c)
	}
	return durationBuckets[len(durationBuckets)-1] // in +Inf: the largest bound
}
