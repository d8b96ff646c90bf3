package sandbox

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/agentenv/agentenv/internal/netns"
	"github.com/agentenv/agentenv/internal/runtime"
)

// reaper gives back what boxes hold: it runs undo stacks (a failed boot's,
// a kill's, a pause without memory's) and tears boxes down behind the
// answer, retrying a failing teardown until it succeeds or the server
// shuts down; after a restart it removes the containers and network slots
// no box owns. The boxes it tears down are counted as dying in the
// registry until they are gone. It takes no lock of its own but the
// registry's (through its methods).
type reaper struct {
	reg   *registry
	rec   records
	rt    runtime.Runtime
	slots *netns.Pool
	net   *netns.Manager
	log   *slog.Logger
	// sem bounds the teardowns that run at once (teardownParallel).
	sem chan struct{}
	// stopping ends the retries of failing teardowns (Shutdown).
	stopping chan struct{}
	stopOnce sync.Once
	// retryBase is the first wait between teardown attempts; grace how
	// long Shutdown lets failing teardowns retry.
	retryBase, grace time.Duration
}

func newReaper(reg *registry, rec records, d Deps) reaper {
	return reaper{reg: reg, rec: rec, rt: d.Runtime, slots: d.Slots, net: d.Net, log: d.Log,
		sem: make(chan struct{}, teardownParallel), stopping: make(chan struct{}),
		retryBase: 100 * time.Millisecond, grace: shutdownGrace}
}

// wait waits for the teardown goroutines: failing ones retry for up to
// grace, then stop and leave their boxes to the next start's Recover.
func (r *reaper) wait() {
	done := make(chan struct{})
	go func() { r.reg.teardowns.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(r.grace):
	}
	r.stopOnce.Do(func() { close(r.stopping) })
	<-done
}

// tearDown gives back what u holds for sb (a box Recover does not adopt,
// what a failed boot could not undo at once): the first attempt now when
// now is set, retries behind while it fails. Until it is done the box
// counts against MaxSandboxes.
func (r *reaper) tearDown(ctx context.Context, sb Sandbox, u undo, now bool) {
	t := newTeardown(sb, u)
	tracked := r.reg.track(t)
	r.runTeardown(ctx, t, tracked, now)
}

// runTeardown runs t, the first attempt now when now is set (else behind
// the caller's answer, as a kill), and ends the teardown track counted.
func (r *reaper) runTeardown(ctx context.Context, t *teardown, tracked, now bool) {
	ctx = context.WithoutCancel(ctx)
	if !tracked {
		// After Shutdown nothing waits for a goroutine: one attempt now.
		r.attempt(ctx, t, false)
		return
	}
	n := 1
	if now {
		if r.attempt(ctx, t, true) {
			r.reg.teardowns.Done()
			return
		}
		n = 2
	}
	go r.retry(ctx, t, n)
}

// retry runs attempts from the n-th on until one succeeds or the server
// shuts down; then the record (state killing) is left to Recover. It ends
// a teardown that track counted.
func (r *reaper) retry(ctx context.Context, t *teardown, n int) {
	defer r.reg.teardowns.Done()
	delay := r.retryBase
	for ; ; n++ {
		if n > 1 {
			select {
			case <-time.After(delay):
			case <-r.stopping:
				r.log.Error("sandbox teardown left to the next start", "sandbox", t.sb.ID, "attempts", n-1)
				return
			}
			delay = min(2*delay, teardownRetryMax)
		}
		if r.attempt(ctx, t, true) {
			return
		}
	}
}

// attempt runs what is left of t's undo stack and says whether it is all
// gone; then it forgets the box.
func (r *reaper) attempt(ctx context.Context, t *teardown, willRetry bool) bool {
	r.sem <- struct{}{}
	err := r.runUndo(ctx, &t.u, 0)
	<-r.sem
	if err != nil {
		if willRetry {
			r.log.Warn("sandbox teardown failed; will retry", "sandbox", t.sb.ID, "err", err)
		} else {
			r.log.Error("sandbox teardown failed; left to the next start", "sandbox", t.sb.ID, "err", err)
		}
		return false
	}
	r.reg.tornDown(t.sb.ID)
	close(t.done)
	r.log.Info("sandbox torn down", "sandbox", t.sb.ID, "teardown", time.Since(t.start).Round(time.Millisecond))
	return true
}

// settle waits, up to settleMax, for the teardowns of killed sandboxes that
// match to end. A kill answers before its sandbox lets go of its template
// and snapshot; a delete of them right after the kill must not find them
// in use.
func (r *reaper) settle(match func(Sandbox) bool) {
	var pending []chan struct{}
	for _, t := range r.reg.tearing() {
		if match(t.sb) {
			pending = append(pending, t.done)
		}
	}
	timeout := time.NewTimer(settleMax)
	defer timeout.Stop()
	for _, done := range pending {
		select {
		case <-done:
		case <-timeout.C:
			return
		}
	}
}

// runUndo runs u's steps above floor from the top, those of kinds (all
// when none are given), and removes each that succeeds; it stops at the
// first failure.
func (r *reaper) runUndo(ctx context.Context, u *undo, floor int, kinds ...undoKind) error {
	ctx = context.WithoutCancel(ctx)
	for i := len(u.steps) - 1; i >= floor; i-- {
		s := u.steps[i]
		if len(kinds) > 0 && !containsKind(kinds, s.kind) {
			continue
		}
		if err := r.undoOne(ctx, u.id, s); err != nil {
			return err
		}
		u.steps = append(u.steps[:i:i], u.steps[i+1:]...)
	}
	return nil
}

func (r *reaper) undoOne(ctx context.Context, id string, s undoStep) error {
	switch s.kind {
	case undoRelease:
		s.fn()
	case undoDir:
		return os.RemoveAll(r.rec.dir(id))
	case undoSlot:
		if err := r.slots.Put(ctx, s.slot); err != nil {
			return fmt.Errorf("release network slot %d: %w", s.slot.Index, err)
		}
	case undoContainer:
		if err := r.rt.Destroy(ctx, id); err != nil {
			return fmt.Errorf("destroy container: %w", err)
		}
	case undoListed:
		r.reg.remove(id)
	}
	return nil
}

// removeStrayContainers destroys the runtime's containers no sandbox owns.
func (r *reaper) removeStrayContainers(ctx context.Context) error {
	ids, err := r.rt.List(ctx)
	if err != nil {
		return fmt.Errorf("list runtime containers: %w", err)
	}
	for _, id := range ids {
		if r.reg.holds(id) {
			continue
		}
		r.log.Warn("removing container without a sandbox", "container", id)
		if err := r.rt.Destroy(ctx, id); err != nil {
			r.log.Error("remove stray container", "container", id, "err", err)
		}
	}
	return nil
}

// removeStraySlots deletes the network slots no sandbox uses.
func (r *reaper) removeStraySlots(ctx context.Context) error {
	left, err := r.net.Leftovers()
	if err != nil {
		return fmt.Errorf("list network slots: %w", err)
	}
	for _, i := range left {
		if r.slots.Used(i) {
			continue
		}
		r.log.Warn("removing network slot without a sandbox", "slot", i)
		if err := r.net.Delete(ctx, r.net.SlotFor(i)); err != nil {
			r.log.Error("remove stray network slot", "slot", i, "err", err)
		}
	}
	return nil
}
