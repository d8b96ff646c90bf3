package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"
)

// Memory is the host memory of some sandboxes: PSS (proportional set size:
// pages shared by k processes count 1/k each) summed over each sandbox's
// host processes, in MiB per sandbox.
type Memory struct {
	Sandboxes int `json:"sandboxes"`
	// PssMiB is the mean over the sandboxes; Min and Max bound it.
	PssMiB float64 `json:"pss_mib"`
	MinMiB float64 `json:"min_mib"`
	MaxMiB float64 `json:"max_mib"`
	// The parts of the mean: anonymous memory (the Go runtime of runsc's
	// sentry), file pages (mostly the runsc binary, shared with every
	// runsc process on the host) and shared memory (gVisor's memory file:
	// the sandbox's own processes and files).
	AnonMiB  float64 `json:"anon_mib"`
	FileMiB  float64 `json:"file_mib"`
	ShmemMiB float64 `json:"shmem_mib"`
}

// summarizeMemory turns per-sandbox PSS (KiB) into the mean, min and max
// per sandbox in MiB. An empty input gives zero Memory.
func summarizeMemory(per []pss) Memory {
	if len(per) == 0 {
		return Memory{}
	}
	var sum pss
	lo, hi := per[0].Total, per[0].Total
	for _, p := range per {
		sum = sum.plus(p)
		lo, hi = min(lo, p.Total), max(hi, p.Total)
	}
	n := float64(len(per))
	mib := func(kib uint64) float64 { return float64(kib) / 1024 }
	return Memory{
		Sandboxes: len(per),
		PssMiB:    mib(sum.Total) / n, MinMiB: mib(lo), MaxMiB: mib(hi),
		AnonMiB: mib(sum.Anon) / n, FileMiB: mib(sum.File) / n, ShmemMiB: mib(sum.Shmem) / n,
	}
}

// memTarget is a target whose sandboxes' host processes can be found.
type memTarget interface {
	name() string
	boot(ctx context.Context, memMB int) (string, error)
	kill(ctx context.Context, id string) error
	pids(ctx context.Context, id string) ([]int, error)
}

var (
	_ memTarget = (*agentenvTarget)(nil)
	_ memTarget = (*runscTarget)(nil)
	_ memTarget = (*crunTarget)(nil)
)

// settle is how long sandboxes sit idle before their memory is read: long
// enough for start-up work (envd's first GC, lazily faulted pages) to end.
const settle = time.Second

// memory measures PSS per idle sandbox, with Density of them running, on
// every target; then per fork child, with Density children of one parent,
// on agentenv and runsc.
func (r *runner) memory(ctx context.Context) error {
	if os.Geteuid() != 0 {
		r.rep.Notes = append(r.rep.Notes, "memory rows skipped: reading other users' /proc/<pid>/smaps_rollup needs root")
		return nil
	}
	r.rep.Memory = map[string]map[Operation]Memory{}
	set := func(target string, op Operation, m Memory) {
		if r.rep.Memory[target] == nil {
			r.rep.Memory[target] = map[Operation]Memory{}
		}
		r.rep.Memory[target][op] = m
	}
	mts := []memTarget{r.ts.agentenv}
	if r.ts.runsc != nil {
		mts = append(mts, r.ts.runsc)
	}
	if r.ts.crun != nil {
		mts = append(mts, r.ts.crun)
	}
	for _, t := range mts {
		r.progressf("memory: %d idle sandboxes (%s)", r.cfg.Density, t.name())
		m, err := idleMemory(ctx, t, r.cfg.Density)
		if err != nil {
			return fmt.Errorf("%s: idle: %w", t.name(), err)
		}
		set(t.name(), OpMemIdle, m)
	}
	for _, s := range r.snappers() {
		r.progressf("memory: %d fork children of one sandbox (%s)", r.cfg.Density, s.name())
		m, err := forkMemory(ctx, s, r.cfg.Density)
		if err != nil {
			return fmt.Errorf("%s: fork children: %w", s.name(), err)
		}
		set(s.name(), OpMemFork, m)
	}
	return nil
}

// idleMemory boots n sandboxes one after the other, lets them settle and
// reads their PSS.
func idleMemory(ctx context.Context, t memTarget, n int) (m Memory, err error) {
	var ids []string
	defer func() {
		if kerr := killAll(ctx, t, ids); kerr != nil {
			err = errors.Join(err, kerr)
		}
	}()
	for range n {
		id, err := t.boot(ctx, 0)
		if err != nil {
			return Memory{}, err
		}
		ids = append(ids, id)
	}
	return measurePSS(ctx, t, ids)
}

// forkMemory forks one sandbox into n children and reads the children's
// PSS (the parent is not counted).
func forkMemory(ctx context.Context, s snapper, n int) (m Memory, err error) {
	var ids []string
	defer func() {
		if kerr := killAll(ctx, s, ids); kerr != nil {
			err = errors.Join(err, kerr)
		}
	}()
	parent, err := s.boot(ctx, 0)
	if err != nil {
		return Memory{}, err
	}
	ids = append(ids, parent)
	kids, err := s.fork(ctx, parent, n)
	ids = append(ids, kids...)
	if err != nil {
		return Memory{}, err
	}
	return measurePSS(ctx, s, kids)
}

func measurePSS(ctx context.Context, t memTarget, ids []string) (Memory, error) {
	select {
	case <-ctx.Done():
		return Memory{}, context.Cause(ctx)
	case <-time.After(settle):
	}
	var per []pss
	for _, id := range ids {
		pids, err := t.pids(ctx, id)
		if err != nil {
			return Memory{}, err
		}
		p, err := processesPSS(pids)
		if err != nil {
			return Memory{}, fmt.Errorf("sandbox %s: %w", id, err)
		}
		per = append(per, p)
	}
	return summarizeMemory(per), nil
}
