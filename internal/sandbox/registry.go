package sandbox

import (
	"fmt"
	"sort"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
)

// registry is the manager's table of sandboxes: the live ones, the
// tombstones of lost ones and how the last ended ones ended. Its maps are
// guarded by Manager.mu (admission counts live sandboxes and teardowns
// under one lock); each entry's record by the entry's own lock.
type registry struct {
	boxes map[string]*entry
	lost  map[string]Sandbox
	ended ended // how the last killed and timed-out sandboxes ended
}

// lookup finds a live sandbox, or says why there is none. Callers hold
// Manager.mu.
func (r *registry) lookup(id string) (*entry, error) {
	if e, ok := r.boxes[id]; ok {
		return e, nil
	}
	if sb, ok := r.lost[id]; ok {
		return nil, WithEndCause(fmt.Errorf("sandbox %q was lost: %s: %w", id, sb.Reason, ErrLost), sb.EndCause)
	}
	if how, cause, ok := r.ended.how(id); ok {
		return nil, WithEndCause(errdefs.NotFound("sandbox %q does not exist: %s", id, how), cause)
	}
	return nil, errdefs.NotFound("sandbox %q does not exist (it may have been killed or timed out)", id)
}

// all returns the live entries. Callers hold Manager.mu.
func (r *registry) all() []*entry {
	entries := make([]*entry, 0, len(r.boxes))
	for _, e := range r.boxes {
		entries = append(entries, e)
	}
	return entries
}

func (m *Manager) entry(id string) (*entry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lookup(id)
}

func (m *Manager) entries() []*entry {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.all()
}

// Get returns a sandbox.
func (m *Manager) Get(id string) (Sandbox, error) {
	e, err := m.entry(id)
	if err != nil {
		return Sandbox{}, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.sb, nil
}

// Filter selects sandboxes in List.
type Filter struct {
	Metadata map[string]string
	States   []State
	// Template, if set, keeps the sandboxes of that template only.
	Template string `json:",omitempty"`
	// StartedAfter, if set, keeps those started at or after it.
	StartedAfter time.Time `json:",omitzero"`
	// Owner, if set, keeps the sandboxes of that API key's name.
	Owner string `json:",omitempty"`
}

// Match reports whether sb passes the filter.
func (f Filter) Match(sb Sandbox) bool {
	if f.Template != "" && sb.Template != f.Template {
		return false
	}
	if f.Owner != "" && sb.Owner != f.Owner {
		return false
	}
	if !f.StartedAfter.IsZero() && sb.StartedAt.Before(f.StartedAfter) {
		return false
	}
	for k, v := range f.Metadata {
		if sb.Metadata[k] != v {
			return false
		}
	}
	if len(f.States) == 0 {
		return true
	}
	// A filter for paused keeps both kinds of pause (E2B has one).
	for _, s := range f.States {
		if sb.State == s || sb.State.E2B() == s {
			return true
		}
	}
	return false
}

// List returns the sandboxes that match, oldest first.
func (m *Manager) List(f Filter) []Sandbox {
	entries := m.entries()
	out := make([]Sandbox, 0, len(entries))
	for _, e := range entries {
		e.mu.Lock()
		sb := e.sb
		e.mu.Unlock()
		if f.Match(sb) {
			out = append(out, sb)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].StartedAt.Equal(out[j].StartedAt) {
			return out[i].ID < out[j].ID
		}
		return out[i].StartedAt.Before(out[j].StartedAt)
	})
	return out
}

// Route is where traffic to one port of a sandbox goes, read in one
// look-up under the sandbox's lock: its address, boot and gone channel
// belong to the same boot.
type Route struct {
	// Addr is host:port of the port; "" unless the sandbox runs.
	Addr string
	// Boot changes each time the sandbox boots again under its ID (a
	// resume without memory), maybe at an address another sandbox had:
	// connections kept for one boot must never carry the next one's
	// requests.
	Boot uint64
	// Gone is closed when this boot stops being reachable (killed, died,
	// paused without its memory).
	Gone <-chan struct{}
	// Token is what requests to the sandbox's exposed ports (not envd)
	// must carry; "" when they are public.
	Token string
	// EnvdToken is envd's access token ("" when envd takes any request).
	EnvdToken string
	State     State
	// Wakes says Resolve resumes the sandbox once check passes: it is
	// paused and resumes on traffic.
	Wakes bool
}

// routeLocked reads e's route to port. Callers hold e.mu.
func routeLocked(e *entry, port int) Route {
	r := Route{Boot: e.boot, Gone: e.gone, Token: e.sb.TrafficToken, EnvdToken: e.sb.AccessToken, State: e.sb.State}
	if r.State == StateRunning {
		r.Addr = e.sb.Addr(port)
	}
	return r
}

// Resolve is the proxy's one look-up per request: the route to a running
// sandbox's port. check, if not nil, is shown the route as found before
// anything is done to the sandbox, and its error is returned as is: a
// paused sandbox that resumes on traffic (E2B's autoResume) is resumed
// only after check passes (traffic without its token must not wake it).
// A sandbox that is not (or no longer) running gives ErrNotFound, which
// the proxy answers with 502, read by the E2B SDK as "not running".
func (m *Manager) Resolve(id string, port int, check func(Route) error) (Route, error) {
	e, err := m.entry(id)
	if err != nil {
		return Route{}, err
	}
	e.mu.Lock()
	r, wake := routeLocked(e, port), e.sb.wakesOnTraffic()
	r.Wakes = wake
	e.mu.Unlock()
	if check != nil {
		if err := check(r); err != nil {
			return r, err
		}
	}
	if wake {
		// Concurrent requests queue on the sandbox's lock behind one
		// resume.
		if r, err = m.wake(e, port); err != nil {
			return Route{}, err
		}
	}
	if r.State != StateRunning {
		return r, fmt.Errorf("sandbox %q is %s, not running: %w", id, r.State, errdefs.ErrNotFound)
	}
	return r, nil
}

// FindByToken returns a running or paused sandbox whose envd access token
// match accepts (a signed file URL without a sandbox ID is matched
// against each).
func (m *Manager) FindByToken(match func(token string) bool) (string, bool) {
	for _, e := range m.entries() {
		e.mu.Lock()
		id, token, state := e.sb.ID, e.sb.AccessToken, e.sb.State
		e.mu.Unlock()
		if token != "" && state.Live() && match(token) {
			return id, true
		}
	}
	return "", false
}
