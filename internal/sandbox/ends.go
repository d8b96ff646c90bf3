package sandbox

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/agentenv/agentenv/internal/runtime"
)

// Why a sandbox ended (EndObserver's cause, Sandbox.EndCause).
const (
	EndKilled  = "killed"  // a client killed it
	EndTimeout = "timeout" // its timeout passed (its action was a kill, or a pause that failed)
	EndOOM     = "oom"     // it died out of its memory limit: the host's memory cgroup killed it
	EndLost    = "lost"    // it died on its own otherwise, or was gone after a restart
)

// EndObserver is told once of each sandbox that ends (cause one of the End
// constants), with its record: a spare of the hot pool that no client had
// is not told.
type EndObserver func(cause string, sb Sandbox)

// maxPendingEnds bounds the ends kept for an observer not yet set (the
// sandboxes Recover finds lost before the server's metrics are wired).
const maxPendingEnds = 10000

// endNotes hands ends to the observer, keeping those before it is set.
type endNotes struct {
	mu      sync.Mutex
	fn      EndObserver
	pending []pendingEnd
}

type pendingEnd struct {
	cause string
	sb    Sandbox
}

// ObserveEnds sets the observer of sandbox ends and tells it of those
// that came before (nil: none).
func (m *Manager) ObserveEnds(fn EndObserver) {
	m.ends.mu.Lock()
	defer m.ends.mu.Unlock()
	m.ends.fn = fn
	if fn == nil {
		return
	}
	for _, p := range m.ends.pending {
		fn(p.cause, p.sb)
	}
	m.ends.pending = nil
}

// note tells the observer that sb ended for cause. Callers hold no
// lock of the manager's.
func (n *endNotes) note(cause string, sb Sandbox) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.fn != nil {
		n.fn(cause, sb)
		return
	}
	if len(n.pending) < maxPendingEnds {
		n.pending = append(n.pending, pendingEnd{cause, sb})
	}
}

// death is why a sandbox died on its own: its cause (EndOOM or EndLost)
// and the reason its tombstone gives.
type death struct{ cause, reason string }

// deathOf says why sandbox sb's processes exited without a kill: out of
// memory when the host's OOM killer killed a process in its memory cgroup
// (read before its teardown removes the cgroup), lost otherwise. Without
// the cgroup's count (no cgroups), the reason names both.
func deathOf(ctx context.Context, rt runtime.Runtime, sb Sandbox) death {
	st, ok := rt.(runtime.Statser)
	if !ok {
		return death{EndLost, "it stopped unexpectedly (out of its memory limit, or its init process exited)"}
	}
	s, err := st.Stats(ctx, sb.ID)
	switch {
	case err != nil:
		return death{EndLost, "it stopped unexpectedly (out of its memory limit, or its init process exited)"}
	case s.OOMKills > 0:
		limit := "its memory limit"
		if s.MemLimit > 0 {
			limit = fmt.Sprintf("its memory limit (%d MiB)", s.MemLimit>>20)
		}
		return death{EndOOM, "it stopped unexpectedly: it ran out of " + limit + " and the host killed it (give it more memory when you create it, or keep its processes, files in /dev/shm and in-memory write layer within it)"}
	}
	return death{EndLost, "it stopped unexpectedly (its init process exited, or its kernel crashed or was killed; not for memory)"}
}

// EndCause is why the sandbox an error is about ended (one of the End
// constants), when the error says: a request for a sandbox that is gone
// and whose end is remembered. A lost sandbox whose cause is not known
// (lost on a fleet node that went away) is EndLost; other errors give "".
func EndCause(err error) string {
	var e *endedError
	if errors.As(err, &e) {
		return e.cause
	}
	if errors.Is(err, ErrLost) {
		return EndLost
	}
	return ""
}

// WithEndCause is err saying that its sandbox ended for cause (err
// itself when cause is ""): for errors that crossed a wire.
func WithEndCause(err error, cause string) error {
	if cause == "" || err == nil {
		return err
	}
	return &endedError{cause: cause, err: err}
}

// endedError is an error about a sandbox that ended, with its cause.
type endedError struct {
	cause string
	err   error
}

func (e *endedError) Error() string { return e.err.Error() }
func (e *endedError) Unwrap() error { return e.err }
