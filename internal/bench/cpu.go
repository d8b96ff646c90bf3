package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// The CPU rows: what one operation costs in CPU time, summed over every
// process of the target (see cgroup.go). Each is measured over a batch of
// operations, from a quiet point to the next one, less the target's idle
// use over that time, divided by the operations in the batch.
const (
	OpForkChild  Operation = "fork_child"
	OpChurnCycle Operation = "churn_cycle"
)

// cpuRows are the CPU table's rows in order, with their labels.
var cpuRows = []struct {
	op    Operation
	label string
}{
	{OpCreate, "create until a command runs"},
	{OpExec, "exec /bin/true"},
	{OpKill, "kill"},
	{OpSnapshot, "snapshot, idle"},
	{OpRestore, "restore until a command runs"},
	{OpForkChild, "fork, per child (fork 4, each child ran a command)"},
	{OpChurnCycle, "churn cycle: create+exec+kill, %d in flight"},
}

// cpuChurnDuration is how long each CPU batch of churn cycles runs.
const cpuChurnDuration = 3 * time.Second

// CPUCost is the CPU time one operation costs a target.
type CPUCost struct {
	// Ops is the number of operations per batch; BatchesMs is the CPU per
	// operation of each batch, in ms.
	Ops       int       `json:"ops_per_batch"`
	BatchesMs []float64 `json:"batches_ms"`
	// MedianMs, MinMs and MaxMs summarise BatchesMs.
	MedianMs float64 `json:"median_ms"`
	MinMs    float64 `json:"min_ms"`
	MaxMs    float64 `json:"max_ms"`
	// WallMs is the median of the batches' wall time per operation (for
	// the churn cycle, with 8 in flight).
	WallMs float64 `json:"wall_ms"`
}

// cpuSample is one batch: the CPU it used less idle, its wall time and
// its number of operations.
type cpuSample struct {
	cpu, wall time.Duration
	ops       int
}

// summarizeCPU turns a row's batches into a CPUCost.
func summarizeCPU(samples []cpuSample) CPUCost {
	var c CPUCost
	var walls []float64
	for _, s := range samples {
		if s.ops < 1 {
			continue
		}
		c.Ops = s.ops
		c.BatchesMs = append(c.BatchesMs, ms(s.cpu)/float64(s.ops))
		walls = append(walls, ms(s.wall)/float64(s.ops))
	}
	if len(c.BatchesMs) == 0 {
		return c
	}
	sorted := slices.Sorted(slices.Values(c.BatchesMs))
	c.MedianMs, c.MinMs, c.MaxMs = median(sorted), sorted[0], sorted[len(sorted)-1]
	c.WallMs = median(slices.Sorted(slices.Values(walls)))
	return c
}

// median of sorted values: the middle one, or the mean of the two middle
// ones.
func median(sorted []float64) float64 {
	n := len(sorted)
	switch {
	case n == 0:
		return 0
	case n%2 == 1:
		return sorted[n/2]
	default:
		return (sorted[n/2-1] + sorted[n/2]) / 2
	}
}

// cpuTargets are the targets whose CPU can be counted: those with a
// cgroup.
func (r *runner) cpuTargets() []target {
	var out []target
	for _, t := range r.ts.all {
		if r.groups.get(t.name()) != nil {
			out = append(out, t)
		}
	}
	return out
}

// cpu measures the CPU rows: rounds of batches, targets taking turns
// round by round so a slow phase of the host hits every column alike.
func (r *runner) cpu(ctx context.Context) error {
	ts := r.cpuTargets()
	if len(ts) == 0 {
		r.rep.Notes = append(r.rep.Notes, "cpu: skipped: no target runs in a cgroup of the bench (needs root and cgroup v2; agentenv needs --serve)")
		return nil
	}
	samples := map[string]map[Operation][]cpuSample{}
	idle := map[string][]float64{}
	for round := range r.cfg.CPURounds {
		for _, t := range ts {
			r.progressf("cpu: %s, round %d of %d, %d operations per batch", t.name(), round+1, r.cfg.CPURounds, r.cfg.CPUOps)
			m := newCPUMeter(r.groups.get(t.name()))
			if err := m.calibrate(ctx); err != nil {
				return fmt.Errorf("%s: idle CPU: %w", t.name(), err)
			}
			idle[t.name()] = append(idle[t.name()], m.idle)
			got, err := r.cpuRound(ctx, t, m)
			if err != nil {
				return fmt.Errorf("%s, round %d: %w", t.name(), round+1, err)
			}
			if samples[t.name()] == nil {
				samples[t.name()] = map[Operation][]cpuSample{}
			}
			for op, s := range got {
				samples[t.name()][op] = append(samples[t.name()][op], s)
			}
		}
	}
	r.rep.CPU = map[string]map[Operation]CPUCost{}
	r.rep.CPUIdle = map[string]float64{}
	for name, byOp := range samples {
		r.rep.CPU[name] = map[Operation]CPUCost{}
		for op, s := range byOp {
			r.rep.CPU[name][op] = summarizeCPU(s)
		}
		r.rep.CPUIdle[name] = 1000 * median(slices.Sorted(slices.Values(idle[name])))
	}
	r.rep.CPURounds = r.cfg.CPURounds
	if r.groups.get(TargetAgentenv) == nil {
		r.rep.Notes = append(r.rep.Notes, "cpu: agentenv not measured: its CPU is counted only for a server the bench starts (--serve)")
	}
	return nil
}

// cpuRound runs one batch of each CPU row on t. What a batch leaves (the
// sandboxes it created, snapshots) is removed between batches, untimed,
// except the created sandboxes, which the kill batch kills.
func (r *runner) cpuRound(ctx context.Context, t target, m *cpuMeter) (out map[Operation]cpuSample, err error) {
	n := r.cfg.CPUOps
	out = map[Operation]cpuSample{}
	var live []string
	defer func() {
		if kerr := killAll(ctx, t, live); kerr != nil {
			err = errors.Join(err, fmt.Errorf("kill: %w", kerr))
		}
	}()
	batch := func(op Operation, ops func() int, f func(context.Context) error) error {
		cpu, wall, err := m.measure(ctx, f)
		if err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
		out[op] = cpuSample{cpu: cpu, wall: wall, ops: ops()}
		return nil
	}
	fixed := func(k int) func() int { return func() int { return k } }

	// Untimed: the first create after a pause pays for cold caches.
	if err := churnCycle(ctx, t); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	err = batch(OpCreate, fixed(n), func(ctx context.Context) error {
		for range n {
			id, err := t.create(ctx)
			if err != nil {
				return err
			}
			live = append(live, id)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	err = batch(OpExec, fixed(2*n), func(ctx context.Context) error {
		for range 2 * n {
			if err := t.exec(ctx, live[0]); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if s, ok := t.(snapper); ok {
		if err := r.cpuSnapper(ctx, s, live[0], m, batch); err != nil {
			return nil, err
		}
	}
	err = batch(OpKill, fixed(len(live)), func(ctx context.Context) error {
		for len(live) > 0 {
			if err := t.kill(ctx, live[0]); err != nil {
				return err
			}
			live = live[1:]
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	var th Throughput
	err = batch(OpChurnCycle, func() int { return th.Cycles }, func(ctx context.Context) (err error) {
		th, err = churn(ctx, t, r.cfg.ChurnInFlight, cpuChurnDuration)
		return err
	})
	return out, err
}

// cpuSnapper runs the batches of the rows only snappers have: snapshot,
// restore and fork, on the idle sandbox id.
func (r *runner) cpuSnapper(ctx context.Context, s snapper, id string, m *cpuMeter,
	batch func(Operation, func() int, func(context.Context) error) error) (err error) {
	n := r.cfg.CPUOps
	fixed := func(k int) func() int { return func() int { return k } }
	var snaps, kids []string
	// Untimed, and run after each batch: what the batch made goes before
	// the next one starts (measure waits for the target to be quiet).
	drop := func() error {
		var errs []error
		if ctx.Err() == nil {
			errs = append(errs, forEach(ctx, kids, 8, s.kill))
		}
		kids = nil
		for _, sn := range snaps {
			errs = append(errs, s.dropSnapshot(ctx, sn))
		}
		snaps = nil
		return errors.Join(errs...)
	}
	defer func() { err = errors.Join(err, drop()) }()

	err = batch(OpSnapshot, fixed(n), func(ctx context.Context) error {
		for range n {
			sn, err := s.snapshot(ctx, id)
			if err != nil {
				return err
			}
			snaps = append(snaps, sn)
		}
		return nil
	})
	if err != nil {
		return err
	}
	base := snaps[0]
	snaps = snaps[1:]
	if err := drop(); err != nil {
		return err
	}
	snaps = []string{base}
	// Untimed: the first restore of a snapshot fills agentenv's pool of
	// containers created in advance; later ones refill what they took.
	kid, err := s.restore(ctx, base)
	if err != nil {
		return fmt.Errorf("warm-up restore: %w", err)
	}
	kids = append(kids, kid)
	err = batch(OpRestore, fixed(n), func(ctx context.Context) error {
		for range n {
			kid, err := s.restore(ctx, base)
			if err != nil {
				return err
			}
			kids = append(kids, kid)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := drop(); err != nil {
		return err
	}
	const children = 4
	forks := max(1, n/children)
	got, err := s.fork(ctx, id, children) // untimed warm-up, as for restore
	kids = append(kids, got...)
	if err != nil {
		return fmt.Errorf("warm-up fork: %w", err)
	}
	if err := drop(); err != nil {
		return err
	}
	return batch(OpForkChild, fixed(forks*children), func(ctx context.Context) error {
		for range forks {
			got, err := s.fork(ctx, id, children)
			kids = append(kids, got...)
			if err != nil {
				return err
			}
		}
		return nil
	})
}

// writeCPU prints the CPU table, if the CPU rows were measured.
func writeCPU(w io.Writer, rep Report) error {
	if len(rep.CPU) == 0 {
		return nil
	}
	var targets []string
	for _, t := range rep.Targets {
		if _, ok := rep.CPU[t]; ok {
			targets = append(targets, t)
		}
	}
	fmt.Fprintf(w, "\nCPU per operation: ms of CPU summed over every process of the target (cgroup v2 cpu.stat), idle use subtracted; median of %d batches (min–max); wall ms per operation in brackets\n", rep.CPURounds)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	header := append([]string{"operation"}, targets...)
	var others []string
	for _, t := range targets {
		if t != TargetAgentenv {
			others = append(others, t)
			if _, ok := rep.CPU[TargetAgentenv]; ok {
				header = append(header, TargetAgentenv+"/"+t)
			}
		}
	}
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, row := range cpuRows {
		label := row.label
		if row.op == OpChurnCycle {
			label = fmt.Sprintf(label, rep.ChurnInFlight)
		}
		cells := []string{label}
		any := false
		for _, t := range targets {
			c, ok := rep.CPU[t][row.op]
			if !ok || len(c.BatchesMs) == 0 {
				cells = append(cells, "-")
				continue
			}
			any = true
			cells = append(cells, cpuCell(c))
		}
		if !any {
			continue
		}
		if a, ok := rep.CPU[TargetAgentenv]; ok {
			for _, t := range others {
				o, ook := rep.CPU[t][row.op]
				cells = append(cells, ratio(a[row.op].MedianMs, o.MedianMs, len(a[row.op].BatchesMs) > 0 && ook && len(o.BatchesMs) > 0))
			}
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	idle := []string{"idle, subtracted (ms CPU per s)"}
	for _, t := range targets {
		idle = append(idle, num(rep.CPUIdle[t]))
	}
	fmt.Fprintln(tw, strings.Join(idle, "\t"))
	return tw.Flush()
}

// cpuCell is "median (min–max) [wall]".
func cpuCell(c CPUCost) string {
	s := num(c.MedianMs)
	if len(c.BatchesMs) > 1 {
		s += " (" + num(c.MinMs) + "–" + num(c.MaxMs) + ")"
	}
	return s + " [" + num(c.WallMs) + "]"
}
