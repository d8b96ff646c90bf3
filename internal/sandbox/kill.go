package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/runtime"
)

// Killing answers at once and tears down behind the answer: Kill persists
// state killing (so that a crash leaves the job to Recover), unlists the
// sandbox (Get answers 404, the proxy ends its requests) and hands the
// teardown to a goroutine that retries until it succeeds or the server
// shuts down. Until it is done the sandbox counts against MaxSandboxes (it
// still holds host memory, a container and a network slot) and holds its
// template.

const (
	// teardownParallel bounds the teardowns that run at once (a mass kill
	// must not start a thousand container destroys together).
	teardownParallel = 8
	// teardownRetryMax caps the wait between attempts of a failing teardown.
	teardownRetryMax = 10 * time.Second
	// shutdownGrace is how long Shutdown lets failing teardowns retry
	// before it leaves them to the next start's Recover.
	shutdownGrace = 10 * time.Second
	// settleMax bounds how long a template or snapshot delete waits for
	// the teardowns of the sandboxes that used it.
	settleMax = 10 * time.Second
)

// Kill stops a sandbox: it disappears at once, and what it held is
// released behind the answer.
func (m *Manager) Kill(ctx context.Context, id string) error {
	e, err := m.reg.lookup(id)
	if err != nil {
		return err
	}
	return m.kill(ctx, e, death{})
}

// kill moves e to killing, unlists it and starts its teardown. A death
// (the sandbox died on its own) leaves a tombstone that Get reports; the
// zero death is a kill by a client or by the sandbox's timer. Only the
// call that moves the sandbox to killing tells the end observer.
func (m *Manager) kill(ctx context.Context, e *entry, d death) error {
	return m.killWhen(ctx, e, d, nil)
}

// killWhen is kill, done only if cond (when not nil) still holds under
// the sandbox's lock; otherwise it does nothing.
func (m *Manager) killWhen(ctx context.Context, e *entry, d death, cond func(Sandbox) bool) error {
	reason := d.reason
	e.mu.Lock()
	id := e.sb.ID
	if cond != nil && e.sb.State != StateKilling && !cond(e.sb) {
		e.mu.Unlock()
		return nil
	}
	switch e.sb.State {
	case StateCreating:
		e.mu.Unlock()
		return errdefs.Conflict("sandbox %q is still being created: retry in a moment", id)
	case StateKilling:
		// Another kill won: to this caller it is already gone.
		e.mu.Unlock()
		return errdefs.NotFound("sandbox %q does not exist (it was killed)", id)
	}
	was := e.sb.State
	if err := m.rec.move(e, StateKilling); err != nil {
		// Only the record failed to change (every state above may move
		// to killing): tear down all the same; the record goes with it.
		m.d.Log.Warn("kill: record not updated; tearing down anyway", "sandbox", id, "err", err)
	}
	if e.timer != nil {
		e.timer.Stop()
	}
	e.markGone()
	sb, u := e.sb, e.undo
	e.undo = undo{}
	e.mu.Unlock()

	var tomb Sandbox
	cause := d.cause
	note := endNote{at: m.d.Clock.Now()}
	if reason != "" {
		sb.Reason, sb.EndCause = reason, cause
		tomb = lostRecord(sb)
		note.lost = &tomb
	} else if was != StatePooled {
		// Past its end while running: its timer (or a kill racing it).
		cause = EndKilled
		if was == StateRunning && !note.at.Before(sb.EndAt) {
			cause = EndTimeout
			m.reaped.Add(1)
		}
		note.cause = cause
	}
	t := newTeardown(sb, u)
	var tracked bool
	if was == StatePooled {
		// No longer waiting in the hot pool: let it refill. Under m.mu,
		// so that Unlisted counts it once, in the pool or as dying.
		m.mu.Lock()
		m.hot.Remove(sb.Template, id)
		tracked = m.reg.end(t, note)
		m.mu.Unlock()
	} else {
		tracked = m.reg.end(t, note)
	}
	if reason != "" {
		m.rec.saveTombstone(tomb)
	}
	if was != StatePooled {
		m.ends.note(cause, sb)
	}
	m.reap.runTeardown(ctx, t, tracked, false)
	return nil
}

// teardown is one box's removal: its undo stack, which keeps what a failed
// attempt could not give back (a network slot goes back to the pool once).
type teardown struct {
	sb    Sandbox
	u     undo
	start time.Time
	// done is closed once it is all gone.
	done chan struct{}
}

func newTeardown(sb Sandbox, u undo) *teardown {
	u.id = sb.ID
	return &teardown{sb: sb, u: u, start: time.Now(), done: make(chan struct{})}
}

// Shutdown stops accepting creates and waits for those in flight and for
// pending teardowns (failing ones retry for up to shutdownGrace, then are
// left to the next start). Running sandboxes are left running; the next
// start adopts them.
func (m *Manager) Shutdown() {
	for _, e := range m.reg.close() {
		if e.timer != nil {
			e.timer.Stop()
		}
	}
	m.reg.inflight.Wait()
	m.reap.wait()
}

// watch tears a sandbox down when it dies on its own (out of memory, a
// crash of its kernel, its init process gone), whatever its state, and
// keeps a tombstone saying so, instead of listing a dead sandbox.
func (m *Manager) watch(e *entry) {
	e.mu.Lock()
	id, gone, boot := e.sb.ID, e.gone, e.boot
	e.mu.Unlock()
	m.watchBoot(e, id, gone, boot)
}

// watchBoot is watch of e's boot-th boot, whose gone channel is gone.
func (m *Manager) watchBoot(e *entry, id string, gone chan struct{}, boot uint64) {
	w, ok := m.d.Runtime.(runtime.Watcher)
	if !ok {
		return
	}
	exited, err := w.Exited(context.Background(), id)
	if err != nil {
		m.d.Log.Warn("cannot watch sandbox for unexpected exits", "sandbox", id, "err", err)
		return
	}
	go func() {
		select {
		case <-exited:
		case <-gone:
			return
		}
		e.mu.Lock()
		sb, rebooted := e.sb, e.boot != boot || e.sb.State == StatePausedFiles
		e.mu.Unlock()
		state := sb.State
		if state == StateKilling || rebooted {
			return // being killed, or stopped by a pause without memory, on purpose
		}
		d := deathOf(context.Background(), m.d.Runtime, sb)
		if tail := logTail(filepath.Join(m.rec.dir(id), "console.log"), 300); tail != "" {
			d.reason += "; last output: " + tail
		}
		m.d.Log.Warn("sandbox died", "sandbox", id, "state", state, "cause", d.cause, "reason", d.reason)
		if err := m.kill(context.Background(), e, d); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			m.d.Log.Error("clean up dead sandbox", "sandbox", id, "err", err)
		}
	}()
}

// logTail returns the last n bytes of a log file on one line.
func logTail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return ""
	}
	off := st.Size() - n
	if off < 0 {
		off = 0
	}
	b := make([]byte, st.Size()-off)
	f.ReadAt(b, off)
	return strings.Join(strings.Fields(string(b)), " ")
}
