package sandbox

import (
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
)

// registry is the manager's table of sandboxes: the live ones, the
// tombstones of lost ones, how the last ended ones ended, the ones being
// torn down, and the creates in flight. It counts what holds host
// resources (admission), so each change is one step under its own lock:
// a kill moves a sandbox from live to dying at once, and nothing ever sees
// it in neither or both.
//
// Lock order: its lock is innermost. It may be taken while an entry's
// lock, Manager.mu, a pool's or the disk ledger's is held, and nothing is
// called while it is held (its methods only read and write its fields).
// Each entry's record is guarded by the entry's own lock.
type registry struct {
	mu    sync.Mutex
	boxes map[string]*entry
	lost  map[string]Sandbox
	ended ended // how the last killed and timed-out sandboxes ended
	// dying holds the IDs being torn down behind an answered kill (or a
	// failed create's cleanup that is retried): admission counts them.
	dying map[string]*teardown
	// closed is set by Shutdown: no create is admitted and no teardown
	// goroutine started after it.
	closed bool
	// inflight counts the admitted creates; teardowns the teardown
	// goroutines. Both are added to under mu, only while not closed, so
	// that Shutdown's waits see every one.
	inflight  sync.WaitGroup
	teardowns sync.WaitGroup
}

// lookup finds a live sandbox, or says why there is none.
func (r *registry) lookup(id string) (*entry, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
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

// get is the live entry of id, or nil.
func (r *registry) get(id string) *entry {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.boxes[id]
}

// all returns the live entries.
func (r *registry) all() []*entry {
	r.mu.Lock()
	defer r.mu.Unlock()
	entries := make([]*entry, 0, len(r.boxes))
	for _, e := range r.boxes {
		entries = append(entries, e)
	}
	return entries
}

// add lists e under its ID.
func (r *registry) add(e *entry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.boxes == nil {
		r.boxes = map[string]*entry{}
	}
	r.boxes[e.sb.ID] = e
}

// remove unlists the live sandbox id (a failed boot's undo).
func (r *registry) remove(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.boxes, id)
}

// bury keeps the tombstone of a lost sandbox: look-ups of its ID say why
// it is gone.
func (r *registry) bury(tomb Sandbox) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.buryLocked(tomb)
}

func (r *registry) buryLocked(tomb Sandbox) {
	if r.lost == nil {
		r.lost = map[string]Sandbox{}
	}
	r.lost[tomb.ID] = tomb
}

// admit counts a create in flight unless the server is shutting down or
// max sandboxes (live and being torn down) exist. The caller calls
// r.inflight.Done when the create ends.
func (r *registry) admit(max int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return fmt.Errorf("server is shutting down: %w", errdefs.ErrUnavailable)
	}
	// Sandboxes still being torn down hold host resources too.
	if n := len(r.boxes) + len(r.dying); n >= max {
		return fmt.Errorf("limit of %d sandboxes reached (%d still being torn down): kill some first, or retry in a moment: %w",
			max, len(r.dying), errdefs.ErrResourceExhausted)
	}
	r.inflight.Add(1)
	return nil
}

// endNote is how a killed sandbox is remembered: its tombstone when it
// died (lost), else the cause of its end when there is one to tell (a
// pooled sandbox's end is not).
type endNote struct {
	lost  *Sandbox
	cause string
	at    time.Time
}

// end is a kill's one step: the live sandbox t.sb.ID is unlisted,
// remembered as note says and counted as dying. It says whether a
// goroutine may tear it down (see track).
func (r *registry) end(t *teardown, note endNote) (tracked bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	id := t.sb.ID
	delete(r.boxes, id)
	switch {
	case note.lost != nil:
		r.buryLocked(*note.lost)
	case note.cause != "":
		r.ended.add(id, note.cause, note.at)
	}
	return r.trackLocked(t)
}

// track counts t's box as being torn down. It says whether a goroutine
// may do it: after Shutdown none may (nothing would wait for it); else
// the goroutine calls r.teardowns.Done when it ends.
func (r *registry) track(t *teardown) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.trackLocked(t)
}

func (r *registry) trackLocked(t *teardown) bool {
	if r.dying == nil {
		r.dying = map[string]*teardown{}
	}
	r.dying[t.sb.ID] = t
	if r.closed {
		return false
	}
	r.teardowns.Add(1)
	return true
}

// tornDown forgets the box id, which holds nothing any more.
func (r *registry) tornDown(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.dying, id)
}

// tearing returns the teardowns under way.
func (r *registry) tearing() []*teardown {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*teardown, 0, len(r.dying))
	for _, t := range r.dying {
		if t != nil {
			out = append(out, t)
		}
	}
	return out
}

// ids returns the IDs of the live sandboxes (when live is set) and of
// those being torn down.
func (r *registry) ids(live bool) (listed, dying []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id := range r.dying {
		dying = append(dying, id)
	}
	if live {
		for id := range r.boxes {
			listed = append(listed, id)
		}
	}
	return listed, dying
}

// count is how many sandboxes are live and how many being torn down.
func (r *registry) count() (live, dying int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.boxes), len(r.dying)
}

// holds says whether id is a live sandbox or one being torn down.
func (r *registry) holds(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, live := r.boxes[id]
	_, dying := r.dying[id]
	return live || dying
}

// listed says whether id is a live sandbox.
func (r *registry) listed(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.boxes[id]
	return ok
}

// mounting names the live sandboxes that mount volume id (an entry's
// volumes never change once it is listed).
func (r *registry) mounting(id string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for sid, e := range r.boxes {
		if slices.Contains(e.volumes, id) {
			out = append(out, sid)
		}
	}
	return out
}

// close admits no more creates and teardown goroutines, and returns the
// live entries.
func (r *registry) close() []*entry {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	entries := make([]*entry, 0, len(r.boxes))
	for _, e := range r.boxes {
		entries = append(entries, e)
	}
	return entries
}

// Get returns a sandbox.
func (m *Manager) Get(id string) (Sandbox, error) {
	e, err := m.reg.lookup(id)
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
	entries := m.reg.all()
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
	e, err := m.reg.lookup(id)
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
	for _, e := range m.reg.all() {
		e.mu.Lock()
		id, token, state := e.sb.ID, e.sb.AccessToken, e.sb.State
		e.mu.Unlock()
		if token != "" && state.Live() && match(token) {
			return id, true
		}
	}
	return "", false
}
