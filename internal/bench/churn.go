package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// DefaultChurnLevels are the numbers of cycles in flight churn runs at by
// default: from one at a time to twice the slot pool, far past two cores.
var DefaultChurnLevels = []int{1, 2, 4, 8, 16}

// ParseLevels turns "1,2,4,8,16" into levels (churn cycles in flight,
// rollout agents): positive, without duplicates, in ascending order.
func ParseLevels(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("level %q: give comma-separated numbers, each at least 1 (e.g. 1,2,4,8,16)", strings.TrimSpace(f))
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out, nil
}

// mainChurnLevel is the level the main table's churn row shows: want if it
// is one of levels, else the highest.
func mainChurnLevel(levels []int, want int) int {
	if slices.Contains(levels, want) || len(levels) == 0 {
		return want
	}
	return slices.Max(levels)
}

// Throughput is the outcome of a churn run: create → exec → kill cycles
// kept going inFlight at a time.
type Throughput struct {
	InFlight int `json:"in_flight"`
	// Cycles completed without error, and cycles that failed (a failed
	// cycle still kills what it created).
	Cycles int `json:"cycles"`
	Failed int `json:"failed"`
	// Seconds from the start until the last cycle ended: cycles started
	// before the deadline run to the end and count.
	Seconds   float64 `json:"seconds"`
	PerSecond float64 `json:"per_second"`
	// FirstError is the first failure, if any.
	FirstError string `json:"first_error,omitempty"`
	// HostCPUBusy is the share of the host's CPU time (all cores, every
	// process, not only this target's) that was not idle during the run:
	// near 1, the cores were saturated.
	HostCPUBusy float64 `json:"host_cpu_busy"`
}

// perSecond is cycles over elapsed, or 0 when nothing elapsed.
func perSecond(cycles int, elapsed time.Duration) float64 {
	if elapsed <= 0 {
		return 0
	}
	return float64(cycles) / elapsed.Seconds()
}

// churnTarget is what a churn cycle needs: create (which returns once a
// command has run) and kill.
type churnTarget interface {
	create(ctx context.Context) (string, error)
	kill(ctx context.Context, id string) error
}

// churnCycle runs one create → exec → kill cycle. create already runs
// /bin/true (it returns once a command has run), so that is the exec.
func churnCycle(ctx context.Context, t churnTarget) error {
	id, err := t.create(ctx)
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	if err := t.kill(ctx, id); err != nil {
		return fmt.Errorf("kill: %w", err)
	}
	return nil
}

// churn keeps inFlight cycles going on t until d has passed, then waits
// for the cycles in flight. A failed cycle is counted, not fatal: one flaky
// exec in hundreds should not end a long run; all cycles failing is.
func churn(ctx context.Context, t churnTarget, inFlight int, d time.Duration) (Throughput, error) {
	var (
		mu  sync.Mutex
		out = Throughput{InFlight: inFlight}
		wg  sync.WaitGroup
	)
	start := time.Now()
	deadline := start.Add(d)
	for range inFlight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) && ctx.Err() == nil {
				err := churnCycle(ctx, t)
				mu.Lock()
				if err == nil {
					out.Cycles++
				} else if ctx.Err() == nil {
					out.Failed++
					if out.FirstError == "" {
						out.FirstError = err.Error()
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := ctx.Err(); err != nil {
		return out, context.Cause(ctx)
	}
	out.Seconds = elapsed.Seconds()
	out.PerSecond = perSecond(out.Cycles, elapsed)
	if out.Cycles == 0 {
		return out, errors.New("every churn cycle failed: " + out.FirstError)
	}
	return out, nil
}

// churn runs the churn at every level on every target: level by level,
// targets taking turns within a level, so that a slow phase of the host
// hits the columns of one level alike.
func (r *runner) churn(ctx context.Context) error {
	r.rep.Churn = map[string]Throughput{}
	r.rep.ChurnByLevel = map[string][]Throughput{}
	for _, level := range r.cfg.ChurnLevels {
		for _, t := range r.ts.all {
			r.progressf("churn: %s, %d in flight for %s", t.name(), level, r.cfg.ChurnDuration)
			before, cerr := readCPUTimes()
			th, err := churn(ctx, t, level, r.cfg.ChurnDuration)
			if err != nil {
				return fmt.Errorf("%s at %d in flight: %w", t.name(), level, err)
			}
			if after, err := readCPUTimes(); cerr == nil && err == nil {
				th.HostCPUBusy = after.busySince(before)
			}
			r.rep.ChurnByLevel[t.name()] = append(r.rep.ChurnByLevel[t.name()], th)
			if level == r.cfg.ChurnInFlight {
				r.rep.Churn[t.name()] = th
			}
			if th.Failed > 0 {
				r.rep.Notes = append(r.rep.Notes, fmt.Sprintf("churn %s at %d in flight: %d of %d cycles failed; first: %s", t.name(), level, th.Failed, th.Cycles+th.Failed, th.FirstError))
			}
		}
	}
	return nil
}
