package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// DensityRun is the outcome of the density group on one target: many idle
// sandboxes started a few at a time, the host memory they took, and
// whether every one of them still runs a command.
type DensityRun struct {
	Requested int `json:"requested"`
	Parallel  int `json:"parallel"`
	Started   int `json:"started"`
	// FailedCreates were counted, not fatal; CreateErrors are the first
	// few. Stopped says why creating ended before Requested, if it did.
	FailedCreates int      `json:"failed_creates"`
	CreateErrors  []string `json:"create_errors,omitempty"`
	Stopped       string   `json:"stopped,omitempty"`
	// StartSeconds is from the first create until the last one ended.
	StartSeconds float64 `json:"start_seconds"`
	// Create is per create, until a command has run in the sandbox.
	Create Stats `json:"create"`
	// Host memory: MemAvailable before the first create, and how much
	// less there was with all of them up (after a short settle).
	MemAvailableBeforeMiB float64 `json:"mem_available_before_mib"`
	MemAvailableDropMiB   float64 `json:"mem_available_drop_mib"`
	// ThreadsPerSandbox is the mean of host threads over each sandbox's
	// processes.
	ThreadsPerSandbox float64 `json:"threads_per_sandbox"`
	// Answered is how many started sandboxes then ran /bin/true; Exec is
	// the time each took, ExecErrors the first few failures.
	Answered   int      `json:"answered"`
	Exec       Stats    `json:"exec"`
	ExecErrors []string `json:"exec_errors,omitempty"`
	// KillSeconds is the time to kill them all (a few at a time);
	// KillFailed those whose kill failed (the target's close tries again).
	KillSeconds float64 `json:"kill_seconds"`
	KillFailed  int     `json:"kill_failed"`
}

// MiBPerSandbox is the MemAvailable drop per started sandbox.
func (d DensityRun) MiBPerSandbox() float64 {
	if d.Started == 0 {
		return 0
	}
	return d.MemAvailableDropMiB / float64(d.Started)
}

// densityTarget is a target whose sandboxes the density group starts by
// the hundred.
type densityTarget interface {
	name() string
	// createIdle starts a sandbox that lives for the whole group and
	// returns once a command has run in it.
	createIdle(ctx context.Context) (string, error)
	exec(ctx context.Context, id string) error
	// release kills a sandbox; one already gone is fine.
	release(ctx context.Context, id string) error
	// pidsIn returns the sandbox's host processes, found in procs.
	pidsIn(ctx context.Context, procs map[int]proc, id string) ([]int, error)
}

var (
	_ densityTarget = (*agentenvTarget)(nil)
	_ densityTarget = (*runscTarget)(nil)
	_ densityTarget = (*crunTarget)(nil)
)

// densityOpts say how runDensity runs.
type densityOpts struct {
	n, parallel int
	// settle is how long the sandboxes sit idle before memory is read.
	settle time.Duration
	// maxFailsInRow stops creating after that many failures in a row: a
	// server that refuses every create (a ceiling) should not take
	// minutes of failures to report.
	maxFailsInRow int
	// probe, when set, runs with every started sandbox up, after the
	// check.
	probe    func(ctx context.Context, ids []string) error
	progress func(format string, args ...any)
}

// densityErrors is how many errors of each kind a DensityRun keeps.
const densityErrors = 3

// runDensity starts o.n idle sandboxes on t, o.parallel at a time,
// measures the memory they take, runs /bin/true in each, calls the probe
// and kills them all, also when it fails or ctx is cancelled.
func runDensity(ctx context.Context, t densityTarget, o densityOpts) (out DensityRun, err error) {
	out = DensityRun{Requested: o.n, Parallel: o.parallel}
	if o.progress == nil {
		o.progress = func(string, ...any) {}
	}
	var ids []string
	defer func() {
		// Not cancelled (Ctrl-C must still tear down), but bounded.
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute+time.Duration(len(ids))*250*time.Millisecond)
		defer cancel()
		o.progress("density: %s: killing %d sandboxes", t.name(), len(ids))
		start := time.Now()
		var mu sync.Mutex
		kerr := forEach(kctx, ids, 8, func(ctx context.Context, id string) error {
			err := t.release(ctx, id)
			if err != nil {
				mu.Lock()
				out.KillFailed++
				mu.Unlock()
			}
			return err
		})
		out.KillSeconds = time.Since(start).Seconds()
		if kerr != nil {
			err = errors.Join(err, fmt.Errorf("kill %d of %d sandboxes failed: %w", out.KillFailed, len(ids), firstErr(kerr)))
		}
	}()

	memBefore, memErr := readMeminfoKiB("MemAvailable")
	out.MemAvailableBeforeMiB = float64(memBefore) / 1024
	ids, err = startMany(ctx, t, o, &out)
	if err != nil {
		return out, err
	}

	select {
	case <-ctx.Done():
		return out, context.Cause(ctx)
	case <-time.After(o.settle):
	}
	if memAfter, err := readMeminfoKiB("MemAvailable"); memErr == nil && err == nil {
		out.MemAvailableDropMiB = (float64(memBefore) - float64(memAfter)) / 1024
	}
	if out.ThreadsPerSandbox, err = threadsPerSandbox(ctx, t, ids); err != nil {
		return out, fmt.Errorf("count threads: %w", err)
	}

	o.progress("density: %s: /bin/true in each of the %d sandboxes", t.name(), len(ids))
	checkAll(ctx, t, ids, &out)
	if ctx.Err() != nil {
		return out, context.Cause(ctx)
	}
	if o.probe != nil {
		o.progress("density: %s: probing host limits with %d sandboxes up", t.name(), len(ids))
		if err := o.probe(ctx, ids); err != nil {
			return out, fmt.Errorf("limits probe: %w", err)
		}
	}
	return out, nil
}

// startMany creates up to o.n sandboxes, o.parallel at a time, counting
// failures; it returns the IDs of those that started (also on error, so
// that they are killed).
func startMany(ctx context.Context, t densityTarget, o densityOpts, out *DensityRun) ([]string, error) {
	var (
		mu         sync.Mutex
		ids        []string
		times      []time.Duration
		next       int
		failsInRow int
		wg         sync.WaitGroup
	)
	o.progress("density: %s: starting %d idle sandboxes, %d at a time", t.name(), o.n, o.parallel)
	start := time.Now()
	report := max(o.n/10, 1)
	for range max(o.parallel, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				if next >= o.n || out.Stopped != "" || ctx.Err() != nil {
					mu.Unlock()
					return
				}
				next++
				mu.Unlock()
				t0 := time.Now()
				id, err := t.createIdle(ctx)
				d := time.Since(t0)
				mu.Lock()
				switch {
				case err == nil:
					ids = append(ids, id)
					times = append(times, d)
					failsInRow = 0
					if len(ids)%report == 0 {
						o.progress("density: %s: %d of %d started (%d failed), %.0fs", t.name(), len(ids), o.n, out.FailedCreates, time.Since(start).Seconds())
					}
				case ctx.Err() == nil:
					out.FailedCreates++
					failsInRow++
					if len(out.CreateErrors) < densityErrors {
						out.CreateErrors = append(out.CreateErrors, fmt.Sprintf("with %d up: %v", len(ids), err))
					}
					if o.maxFailsInRow > 0 && failsInRow >= o.maxFailsInRow && out.Stopped == "" {
						out.Stopped = fmt.Sprintf("stopped after %d failed creates in a row, with %d up", failsInRow, len(ids))
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	out.StartSeconds = time.Since(start).Seconds()
	out.Started = len(ids)
	out.Create = Summarize(times)
	if ctx.Err() != nil {
		return ids, context.Cause(ctx)
	}
	if len(ids) == 0 {
		return ids, fmt.Errorf("no sandbox started: %s", firstOf(out.CreateErrors))
	}
	return ids, nil
}

// checkAll runs /bin/true in every sandbox, eight at a time, and records
// how many answered, how long each took and the first failures.
func checkAll(ctx context.Context, t densityTarget, ids []string, out *DensityRun) {
	var (
		mu    sync.Mutex
		times []time.Duration
	)
	forEach(ctx, ids, 8, func(ctx context.Context, id string) error {
		start := time.Now()
		err := t.exec(ctx, id)
		d := time.Since(start)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			if ctx.Err() == nil && len(out.ExecErrors) < densityErrors {
				out.ExecErrors = append(out.ExecErrors, fmt.Sprintf("%s: %v", id, err))
			}
			return nil
		}
		out.Answered++
		times = append(times, d)
		return nil
	})
	out.Exec = Summarize(times)
}

// threadsPerSandbox is the mean number of host threads over each
// sandbox's processes.
func threadsPerSandbox(ctx context.Context, t densityTarget, ids []string) (float64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	procs, err := readProcs()
	if err != nil {
		return 0, err
	}
	var (
		mu    sync.Mutex
		total int
	)
	err = forEach(ctx, ids, 8, func(ctx context.Context, id string) error {
		pids, err := t.pidsIn(ctx, procs, id)
		if err != nil {
			return err
		}
		n := countThreads(pids)
		mu.Lock()
		total += n
		mu.Unlock()
		return nil
	})
	if err != nil {
		return 0, firstErr(err)
	}
	return float64(total) / float64(len(ids)), nil
}

// density runs the density group: on every target in turn (so that their
// sandboxes never share the host), and the limits probe on agentenv.
func (r *runner) density(ctx context.Context) error {
	r.rep.DensityRuns = map[string]DensityRun{}
	dts := []densityTarget{r.ts.agentenv}
	if r.ts.runsc != nil {
		dts = append(dts, r.ts.runsc)
	}
	if r.ts.crun != nil {
		dts = append(dts, r.ts.crun)
	}
	for _, t := range dts {
		o := densityOpts{
			n: r.cfg.DensitySandboxes, parallel: r.cfg.DensityParallel,
			settle: 2 * time.Second, maxFailsInRow: 20, progress: r.progressf,
		}
		var probe *limitsProbe
		if t == densityTarget(r.ts.agentenv) {
			probe = &limitsProbe{api: r.cfg.Client.API, t: t}
			if err := probe.sampleBefore(ctx); err != nil {
				return fmt.Errorf("limits probe: %w", err)
			}
			o.probe = probe.sampleAfter
		}
		d, err := runDensity(ctx, t, o)
		r.rep.DensityRuns[t.name()] = d
		if probe != nil {
			if l, notes, ok := probe.report(d); ok {
				r.rep.Limits = l
				r.rep.Notes = append(r.rep.Notes, notes...)
			}
		}
		if err != nil {
			return fmt.Errorf("%s: %w", t.name(), err)
		}
		if d.FailedCreates > 0 {
			r.rep.Notes = append(r.rep.Notes, fmt.Sprintf("density %s: %d creates failed; first: %s", t.name(), d.FailedCreates, firstOf(d.CreateErrors)))
		}
		if d.Stopped != "" {
			r.rep.Notes = append(r.rep.Notes, fmt.Sprintf("density %s: %s", t.name(), d.Stopped))
		}
		if miss := d.Started - d.Answered; miss > 0 {
			r.rep.Notes = append(r.rep.Notes, fmt.Sprintf("density %s: %d of %d sandboxes did not answer /bin/true; first: %s", t.name(), miss, d.Started, firstOf(d.ExecErrors)))
		}
	}
	return nil
}

func firstOf(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}

// firstErr returns the first error of a join, so that a thousand joined
// failures do not flood the terminal.
func firstErr(err error) error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			if e != nil {
				return e
			}
		}
	}
	return err
}
