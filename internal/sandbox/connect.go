package sandbox

import (
	"context"
	"time"
)

// Connect is E2B's connect, decided and done under the sandbox's lock so
// that a timeout pause or an auto-resume cannot slip between the look and
// the act: a paused sandbox is resumed (resumed is true), its timeout set
// to d only when that is more than it had left; a running one lives at
// least d more (never shortened). Any other state is returned as it is.
func (m *Manager) Connect(ctx context.Context, id string, d time.Duration) (sb Sandbox, resumed bool, err error) {
	e, err := m.reg.lookup(id)
	if err != nil {
		return Sandbox{}, false, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	switch e.sb.State {
	case StatePaused, StatePausedFiles:
		if d < e.sb.Remaining {
			d = 0 // keep what it had left
		}
		if d != 0 {
			if err := m.d.Limits.checkTimeout(d); err != nil {
				return Sandbox{}, false, err
			}
		}
		if err := m.resumeLocked(ctx, e, d); err != nil {
			return Sandbox{}, false, err
		}
		return e.sb, true, nil
	case StateRunning:
		if d <= 0 || !m.d.Clock.Now().Add(d).After(e.sb.EndAt) {
			return e.sb, false, nil
		}
		if err := m.d.Limits.checkTimeout(d); err != nil {
			return Sandbox{}, false, err
		}
		old := e.sb.EndAt
		e.sb.EndAt = m.d.Clock.Now().UTC().Add(d)
		if err := m.rec.write(e.sb); err != nil {
			e.sb.EndAt = old
			return Sandbox{}, false, err
		}
		m.armTimer(e)
		return e.sb, false, nil
	default:
		return e.sb, false, nil
	}
}
