package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// snapper is a target that can pause, snapshot, restore and fork: agentenv
// and the raw runsc CLI (crun has no equivalent).
type snapper interface {
	name() string
	// boot starts a sandbox with memMB of memory (0: the default) and
	// returns once a command has run in it.
	boot(ctx context.Context, memMB int) (string, error)
	// sh runs script with /bin/sh -c in the sandbox; it fails unless the
	// script exits 0.
	sh(ctx context.Context, id, script string) error
	pause(ctx context.Context, id string) error
	resume(ctx context.Context, id string) error
	// snapshot saves the running sandbox, which keeps running, and returns
	// a handle for restore and dropSnapshot.
	snapshot(ctx context.Context, id string) (string, error)
	dropSnapshot(ctx context.Context, snap string) error
	// restore starts a new sandbox from snap and returns once a command
	// has run in it.
	restore(ctx context.Context, snap string) (string, error)
	// fork makes n children of a running sandbox and returns once
	// /bin/true has run in each. The children it returns must be killed,
	// also when it fails.
	fork(ctx context.Context, id string, n int) ([]string, error)
	kill(ctx context.Context, id string) error
	// pids returns the host processes of the sandbox.
	pids(ctx context.Context, id string) ([]int, error)
}

var (
	_ snapper = (*agentenvTarget)(nil)
	_ snapper = (*runscTarget)(nil)
)

func (r *runner) snappers() []snapper {
	out := []snapper{r.ts.agentenv}
	if r.ts.runsc != nil {
		out = append(out, r.ts.runsc)
	}
	return out
}

// forEach calls f for every id, at most limit at a time, and joins the
// errors.
func forEach(ctx context.Context, ids []string, limit int, f func(context.Context, string) error) error {
	if limit < 1 {
		limit = 1
	}
	var (
		wg   sync.WaitGroup
		sem  = make(chan struct{}, limit)
		errs = make([]error, len(ids))
	)
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			errs[i] = f(ctx, id)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// killAll kills sandboxes, eight at a time. After Ctrl-C it leaves them to
// the targets' close, which runs under a fresh context.
func killAll(ctx context.Context, t interface {
	kill(context.Context, string) error
}, ids []string) error {
	if ctx.Err() != nil {
		return nil
	}
	return forEach(ctx, ids, 8, t.kill)
}

// withSandboxes boots one sandbox per snapper, calls f with their IDs (by
// target name) and kills them afterwards.
func (r *runner) withSandboxes(ctx context.Context, memMB int, f func(ids map[string]string) error) (err error) {
	ids := map[string]string{}
	defer func() {
		for _, s := range r.snappers() {
			if id, ok := ids[s.name()]; ok {
				if kerr := killAll(ctx, s, []string{id}); kerr != nil {
					err = errors.Join(err, fmt.Errorf("%s: kill %s: %w", s.name(), id, kerr))
				}
			}
		}
	}()
	for _, s := range r.snappers() {
		id, err := s.boot(ctx, memMB)
		if err != nil {
			return fmt.Errorf("%s: boot: %w", s.name(), err)
		}
		ids[s.name()] = id
	}
	return f(ids)
}

// pauseResume measures pause and resume of an idle sandbox.
func (r *runner) pauseResume(ctx context.Context) error {
	return r.withSandboxes(ctx, 0, func(ids map[string]string) error {
		var steps []step
		for _, s := range r.snappers() {
			id := ids[s.name()]
			steps = append(steps, step{s.name(), func(ctx context.Context) (map[Operation]time.Duration, error) {
				start := time.Now()
				if err := s.pause(ctx, id); err != nil {
					return nil, fmt.Errorf("pause: %w", err)
				}
				p := time.Since(start)
				start = time.Now()
				if err := s.resume(ctx, id); err != nil {
					return nil, fmt.Errorf("resume: %w", err)
				}
				return map[Operation]time.Duration{OpPause: p, OpResume: time.Since(start)}, nil
			}})
		}
		return r.rounds(ctx, "pause/resume", r.cfg.Iterations, r.cfg.Warmup, steps)
	})
}

// snapshotSteps measures snapshots of the given sandboxes as op; each
// snapshot is deleted (untimed) before the next.
func (r *runner) snapshotSteps(ids map[string]string, op Operation) []step {
	var steps []step
	for _, s := range r.snappers() {
		id := ids[s.name()]
		steps = append(steps, step{s.name(), func(ctx context.Context) (map[Operation]time.Duration, error) {
			start := time.Now()
			snap, err := s.snapshot(ctx, id)
			if err != nil {
				return nil, fmt.Errorf("snapshot: %w", err)
			}
			d := time.Since(start)
			if err := s.dropSnapshot(ctx, snap); err != nil {
				return nil, fmt.Errorf("delete snapshot: %w", err)
			}
			return map[Operation]time.Duration{op: d}, nil
		}})
	}
	return steps
}

func (r *runner) snapshotIdle(ctx context.Context) error {
	return r.withSandboxes(ctx, 0, func(ids map[string]string) error {
		return r.rounds(ctx, "snapshot (idle)", r.cfg.Iterations, r.cfg.Warmup, r.snapshotSteps(ids, OpSnapshot))
	})
}

// dirtySizes are the dirty-memory snapshot rows: MiB written to /dev/shm
// (memory-backed in gVisor) and the memory the sandbox gets for it.
var dirtySizes = []struct {
	mib, memMB int
	op         Operation
}{
	{64, 0, OpSnapshot64},
	{256, 1024, OpSnapshot256},
}

func (r *runner) dirtySnapshots(ctx context.Context) error {
	for _, size := range dirtySizes {
		err := r.withSandboxes(ctx, size.memMB, func(ids map[string]string) error {
			r.progressf("snapshot (%d MiB dirty): writing %d MiB of random data into /dev/shm", size.mib, size.mib)
			script := fmt.Sprintf("dd if=/dev/urandom of=/dev/shm/dirty bs=1M count=%d 2>/dev/null", size.mib)
			for _, s := range r.snappers() {
				if err := s.sh(ctx, ids[s.name()], script); err != nil {
					return fmt.Errorf("%s: dirty %d MiB: %w", s.name(), size.mib, err)
				}
			}
			return r.rounds(ctx, fmt.Sprintf("snapshot (%d MiB dirty)", size.mib), r.cfg.HeavyIterations, 0, r.snapshotSteps(ids, size.op))
		})
		if err != nil {
			return err
		}
	}
	return r.incremental(ctx)
}

// restore measures restoring a snapshot of an idle sandbox until a command
// has run in the new sandbox.
func (r *runner) restore(ctx context.Context) error {
	r.ts.agentenv.recordBoots(true)
	defer r.ts.agentenv.recordBoots(false)
	return r.withSandboxes(ctx, 0, func(ids map[string]string) (err error) {
		snaps := map[string]string{}
		defer func() {
			// After the restored sandboxes are gone: a snapshot in use
			// cannot be deleted.
			for _, s := range r.snappers() {
				if snap, ok := snaps[s.name()]; ok && ctx.Err() == nil {
					if derr := s.dropSnapshot(ctx, snap); derr != nil {
						err = errors.Join(err, fmt.Errorf("%s: delete snapshot: %w", s.name(), derr))
					}
				}
			}
		}()
		var steps []step
		for _, s := range r.snappers() {
			snap, err := s.snapshot(ctx, ids[s.name()])
			if err != nil {
				return fmt.Errorf("%s: snapshot: %w", s.name(), err)
			}
			snaps[s.name()] = snap
			steps = append(steps, step{s.name(), func(ctx context.Context) (map[Operation]time.Duration, error) {
				start := time.Now()
				id, err := s.restore(ctx, snap)
				if err != nil {
					return nil, fmt.Errorf("restore: %w", err)
				}
				d := time.Since(start)
				if err := killAll(ctx, s, []string{id}); err != nil {
					return nil, fmt.Errorf("kill restored sandbox: %w", err)
				}
				return map[Operation]time.Duration{OpRestore: d}, nil
			}})
		}
		return r.rounds(ctx, "restore", r.cfg.Iterations, r.cfg.Warmup, steps)
	})
}

// fork measures fork 4 and fork 16 of an idle sandbox: from the call until
// /bin/true has run in every child.
func (r *runner) fork(ctx context.Context) error {
	return r.withSandboxes(ctx, 0, func(ids map[string]string) error {
		for _, f := range []struct {
			n  int
			op Operation
		}{{4, OpFork4}, {16, OpFork16}} {
			var steps []step
			for _, s := range r.snappers() {
				parent := ids[s.name()]
				steps = append(steps, step{s.name(), func(ctx context.Context) (map[Operation]time.Duration, error) {
					start := time.Now()
					kids, err := s.fork(ctx, parent, f.n)
					d := time.Since(start)
					if kerr := killAll(ctx, s, kids); kerr != nil {
						err = errors.Join(err, fmt.Errorf("kill children: %w", kerr))
					}
					if err != nil {
						return nil, fmt.Errorf("fork %d: %w", f.n, err)
					}
					return map[Operation]time.Duration{f.op: d}, nil
				}})
			}
			if err := r.rounds(ctx, fmt.Sprintf("fork %d", f.n), r.cfg.HeavyIterations, 0, steps); err != nil {
				return err
			}
		}
		return nil
	})
}
