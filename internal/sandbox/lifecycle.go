package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/runtime"
)

// E2B's lifecycle: at its timeout a sandbox is killed, or paused when it
// was created with autoPause (keeping its memory, or only its files with
// autoPauseMemory: false). A paused sandbox is resumed by connect, by
// resume, or by traffic through the proxy when it was created with
// autoResume (never one paused without its memory: that resume reboots it).

// expire runs when a sandbox's timer fires. The state and deadline are
// checked again under the sandbox's lock: a connect or set-timeout that
// won the race has re-armed the timer, and a kill or pause has stopped it.
func (m *Manager) expire(e *entry) {
	ctx := context.Background()
	e.mu.Lock()
	if e.sb.State != StateRunning || m.d.Clock.Now().Before(e.sb.EndAt) {
		e.mu.Unlock()
		return
	}
	id, lc := e.sb.ID, e.sb.Lifecycle
	if lc.AutoPause {
		var err error
		keptMemory := !lc.DropMemory
		if lc.DropMemory {
			err = m.pauseFilesLocked(ctx, e)
			if err != nil && e.sb.State == StateRunning {
				// Its files could not be saved (more than its layer's
				// worth, or envd not answering) and it still runs as it
				// was: keep it whole, with its memory, rather than kill it
				// and lose the files.
				m.d.Log.Warn("pause on timeout without memory failed; pausing with memory", "sandbox", id, "err", err)
				err, keptMemory = m.pauseLocked(ctx, e), true
			}
		} else {
			err = m.pauseLocked(ctx, e)
		}
		e.mu.Unlock()
		if err == nil {
			m.d.Log.Info("sandbox timed out: paused", "sandbox", id, "memory", keptMemory)
			return
		}
		// A sandbox whose time is up must not keep running: kill it.
		m.d.Log.Error("pause on timeout failed; killing the sandbox", "sandbox", id, "err", err)
	} else {
		e.mu.Unlock()
		m.d.Log.Info("sandbox timed out", "sandbox", id)
	}
	expired := func(sb Sandbox) bool { return sb.State == StateRunning && !m.d.Clock.Now().Before(sb.EndAt) }
	if err := m.killWhen(ctx, e, death{}, expired); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		m.d.Log.Error("kill on timeout", "sandbox", id, "err", err)
	}
}

// wake resumes a paused sandbox that asked to be resumed by traffic (for
// the proxy) and returns its route to port. Callers queue on the
// sandbox's lock, so concurrent requests make one resume and then all
// find it running.
func (m *Manager) wake(e *entry, port int) (Route, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.sb.wakesOnTraffic() {
		// As E2B, an auto-resume gives the sandbox its create timeout.
		if err := m.resumeLocked(context.Background(), e, e.sb.Timeout); err != nil {
			m.d.Log.Warn("auto-resume failed", "sandbox", e.sb.ID, "err", err)
			return Route{}, fmt.Errorf("auto-resume of sandbox %q failed: %w", e.sb.ID, err)
		}
		m.d.Log.Info("sandbox auto-resumed by traffic", "sandbox", e.sb.ID)
	}
	return routeLocked(e, port), nil
}

// pauseLocked freezes a running sandbox in place (memory kept). Callers
// hold e.mu and have checked the state.
func (m *Manager) pauseLocked(ctx context.Context, e *entry) error {
	p, ok := m.d.Runtime.(runtime.Pauser)
	if !ok {
		return fmt.Errorf("this runtime cannot pause sandboxes: %w", errdefs.ErrInvalid)
	}
	if err := p.Pause(ctx, e.sb.ID); err != nil {
		return fmt.Errorf("pause %s: %w", e.sb.ID, err)
	}
	m.stopClock(e)
	return m.rec.move(e, StatePaused)
}

// stopClock stops the timer and keeps the time the sandbox had left.
func (m *Manager) stopClock(e *entry) {
	if e.timer != nil {
		e.timer.Stop()
	}
	e.sb.Remaining = e.sb.EndAt.Sub(m.d.Clock.Now())
}

// resumeLocked continues a paused sandbox (a reboot with its files when
// it was paused without memory). Its timeout restarts with timeout when
// not zero, else with the time it had left, else with its create timeout.
// Callers hold e.mu.
func (m *Manager) resumeLocked(ctx context.Context, e *entry, timeout time.Duration) error {
	if !e.sb.State.Paused() {
		return errdefs.Conflict("sandbox %q is %s, not paused", e.sb.ID, e.sb.State)
	}
	if e.sb.State == StatePausedFiles {
		if err := m.rebootLocked(ctx, e); err != nil {
			return err
		}
	} else {
		p, ok := m.d.Runtime.(runtime.Pauser)
		if !ok {
			return fmt.Errorf("this runtime cannot resume sandboxes: %w", errdefs.ErrInvalid)
		}
		if err := p.Resume(ctx, e.sb.ID); err != nil {
			return fmt.Errorf("resume %s: %w", e.sb.ID, err)
		}
	}
	left := e.sb.Remaining
	if timeout != 0 {
		left = timeout
	}
	if left <= 0 {
		// Paused by its timeout: nothing was left.
		left = e.sb.Timeout
	}
	if left <= 0 {
		left = m.d.Limits.DefaultTimeout
	}
	e.sb.EndAt = m.d.Clock.Now().UTC().Add(left)
	e.sb.Remaining = 0
	if err := m.rec.move(e, StateRunning); err != nil {
		return err
	}
	m.armTimer(e)
	return nil
}
