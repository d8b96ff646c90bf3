package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentenv/agentenv/internal/envd"
	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/netns"
	"github.com/agentenv/agentenv/internal/runtime"
	"github.com/agentenv/agentenv/internal/snapshot"
	"github.com/agentenv/agentenv/internal/template"
)

// Deps are the parts the manager drives.
type Deps struct {
	Runtime   runtime.Runtime
	Templates *template.Store
	Net       *netns.Manager
	// Slots hands out network slots (pooled, recycled).
	Slots *netns.Pool
	// Snapshots stores snapshots; nil disables snapshots and fork.
	Snapshots *snapshot.Store
	// Disk admits write layers and checkpoints against the host's disk
	// budget (admission.go); nil admits everything.
	Disk *Disk
	// ReadyTemplates makes creates restore a snapshot of a booted
	// template instead of booting (see MakeReady).
	ReadyTemplates bool
	// WarmPool is how many containers per ready or recently restored
	// template wait for a restore (more after a larger fork; see
	// warm.go). Zero: none.
	WarmPool int
	// Dir holds one directory per sandbox (record, bundle, logs).
	Dir    string
	Limits Limits
	Log    *slog.Logger
	// OnPersist, if set, is called with every sandbox record written (each
	// state transition, timeout and network change), while the sandbox's
	// lock is held: it must not block or call back into the manager.
	OnPersist func(Sandbox)
}

// Manager creates, tracks and kills sandboxes.
type Manager struct {
	d Deps
	// dialer opens every connection to a sandbox (client, proxy): it sets
	// the server's socket mark, without which the firewall refuses them.
	dialer *net.Dialer
	client *http.Client

	mu       sync.Mutex
	boxes    map[string]*entry
	warm     map[string][]warmEntry
	warmS    warmState
	warmKick chan struct{}
	hot      map[string][]string
	cpu      cpuSamples // metrics: the last CPU sample of each sandbox
	hotKick  chan struct{}
	slots    map[int]bool
	lost     map[string]Sandbox
	ended    ended // how the last killed and timed-out sandboxes ended
	// reaped counts the sandboxes killed by their timeout (for /metrics).
	reaped   atomic.Int64
	closed   bool
	inflight sync.WaitGroup

	// warmPrep and hotBoot are held while a spare is made (spares.go);
	// making counts those being made, per template (under mu).
	warmPrep, hotBoot sync.Mutex
	making            map[string]int

	// preparing counts, per template, the builds and MakeReady calls at
	// work on it (under mu), and deletes: the hot and warm pools leave it
	// alone until they end.
	preparing map[string]int

	// dying holds the IDs being torn down behind an answered kill (or a
	// failed create's cleanup that is retried): admission counts them.
	dying     map[string]*teardown
	teardowns sync.WaitGroup
	tearSem   chan struct{}
	// stopping ends the retries of failing teardowns (Shutdown).
	stopping chan struct{}
	stopOnce sync.Once
	// retryBase is the first wait between teardown attempts; grace how
	// long Shutdown lets failing teardowns retry.
	retryBase, grace time.Duration
}

// entry is a live sandbox with its runtime-only parts.
type entry struct {
	mu      sync.Mutex // serialises lifecycle operations on this sandbox
	sb      Sandbox
	timer   *time.Timer
	release func()
	// gone is closed when the sandbox stops being reachable (killed,
	// died, or paused without its memory), so that proxied requests to it
	// end at once. A boot after a pause without memory gets a new one.
	gone     chan struct{}
	goneOnce sync.Once
	// boot counts the sandbox's boots (a resume without memory is one):
	// the proxy pools connections per boot.
	boot uint64
	// bootAt is no later than the sandbox's boot (its files changed since
	// are what a pause without memory saves).
	bootAt time.Time
}

func newEntry(sb Sandbox, release func()) *entry {
	return &entry{sb: sb, release: release, gone: make(chan struct{}), bootAt: time.Now()}
}

func (e *entry) markGone() { e.goneOnce.Do(func() { close(e.gone) }) }

// New returns a manager. Call Recover before serving requests.
func New(d Deps) (*Manager, error) {
	if err := os.MkdirAll(d.Dir, 0o700); err != nil {
		return nil, err
	}
	if d.Log == nil {
		d.Log = slog.Default()
	}
	dialer := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	if d.Net != nil {
		dialer.Control = d.Net.MarkSocket
	}
	return &Manager{
		d:        d,
		dialer:   dialer,
		client:   &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, DialContext: dialer.DialContext}},
		boxes:    map[string]*entry{},
		warm:     map[string][]warmEntry{},
		warmKick: make(chan struct{}, 1),
		hot:      map[string][]string{},
		hotKick:  make(chan struct{}, 1),
		lost:     map[string]Sandbox{},

		dying:     map[string]*teardown{},
		tearSem:   make(chan struct{}, teardownParallel),
		stopping:  make(chan struct{}),
		retryBase: 100 * time.Millisecond,
		grace:     shutdownGrace,
	}, nil
}

// DialSandbox connects to a sandbox's address (from Addr) with the
// server's socket mark (netns.Manager.MarkSocket): the host firewall
// refuses connections to sandboxes without it. The proxy dials with it.
func (m *Manager) DialSandbox(ctx context.Context, network, addr string) (net.Conn, error) {
	return m.dialer.DialContext(ctx, network, addr)
}

func (m *Manager) dir(id string) string { return filepath.Join(m.d.Dir, id) }

// persist writes a sandbox record atomically.
func (m *Manager) persist(sb Sandbox) error {
	b, err := json.MarshalIndent(sb, "", "  ")
	if err != nil {
		return err
	}
	p := filepath.Join(m.dir(sb.ID), "sandbox.json")
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, p); err != nil {
		return err
	}
	if m.d.OnPersist != nil {
		m.d.OnPersist(sb)
	}
	return nil
}

// move applies a state transition and persists it.
func (m *Manager) move(e *entry, to State) error {
	if !canMove(e.sb.State, to) {
		return errdefs.Conflict("sandbox %s is %s and cannot become %s", e.sb.ID, e.sb.State, to)
	}
	e.sb.State = to
	return m.persist(e.sb)
}

func (m *Manager) spec(sb Sandbox, image string) runtime.Spec {
	env := []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"E2B_SANDBOX=true",
		"E2B_SANDBOX_ID=" + sb.ID,
		"E2B_TEMPLATE_ID=" + sb.Template,
		envd.TokenEnv + "=" + sb.AccessToken,
	}
	env, args := m.templateProcess(sb, env)
	return runtime.Spec{
		ID:       sb.ID,
		Dir:      m.dir(sb.ID),
		Image:    image,
		Args:     args,
		Env:      env,
		NetNS:    sb.Slot.Path(),
		CPUs:     float64(sb.CPUs),
		MemoryMB: int64(sb.MemoryMB),
		DiskMB:   int64(sb.DiskMB),
		Pids:     m.d.Limits.pids(sb.Nproc),
		Hostname: "e2b",
	}
}

// EnvdAddr is the host-reachable address of a sandbox's port.
func (sb Sandbox) Addr(port int) string {
	return net.JoinHostPort(sb.Slot.SandboxIP.String(), strconv.Itoa(port))
}

// waitEnvd polls envd's /health until it answers.
func (m *Manager) waitEnvd(ctx context.Context, sb Sandbox) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	url := "http://" + sb.Addr(envd.Port) + "/health"
	delay := time.Millisecond
	// Each attempt gets a short deadline that grows: a SYN that reaches a
	// sandbox still finishing its start (or restore) is dropped, and the
	// kernel would retry it only after a full second.
	attempt := 50 * time.Millisecond
	var last error
	for {
		actx, acancel := context.WithTimeout(ctx, attempt)
		req, _ := http.NewRequestWithContext(actx, http.MethodGet, url, nil)
		resp, err := m.client.Do(req)
		acancel()
		if err != nil {
			m.d.Log.Debug("envd not answering yet", "sandbox", sb.ID, "attempt", attempt, "err", err)
		}
		if attempt < 2*time.Second {
			attempt *= 2
		}
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode/100 == 2 {
				return nil
			}
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("envd in sandbox %s did not answer within 30s (last error: %v): %w", sb.ID, last, errdefs.ErrUnavailable)
		case <-time.After(delay):
		}
		if delay < 20*time.Millisecond {
			delay *= 2
		}
	}
}

// armTimer (re)schedules the sandbox's timeout: a kill, or a pause when
// its lifecycle says so (expire). Callers hold e.mu.
func (m *Manager) armTimer(e *entry) {
	if e.timer != nil {
		e.timer.Stop()
	}
	e.timer = time.AfterFunc(time.Until(e.sb.EndAt), func() { m.expire(e) })
}

func (m *Manager) entry(id string) (*entry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, ok := m.boxes[id]; ok {
		return e, nil
	}
	if sb, ok := m.lost[id]; ok {
		return nil, fmt.Errorf("sandbox %q was lost: %s: %w", id, sb.Reason, ErrLost)
	}
	if how, ok := m.ended.how(id); ok {
		return nil, errdefs.NotFound("sandbox %q does not exist: %s", id, how)
	}
	return nil, errdefs.NotFound("sandbox %q does not exist (it may have been killed or timed out)", id)
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

// Running returns a sandbox only if it is running (for the proxy).
func (m *Manager) Running(id string) (Sandbox, error) {
	sb, err := m.Get(id)
	if err != nil {
		return Sandbox{}, err
	}
	if sb.State != StateRunning {
		return Sandbox{}, errdefs.Conflict("sandbox %q is %s, not running", id, sb.State)
	}
	return sb, nil
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
	for _, s := range f.States {
		if sb.State == s {
			return true
		}
	}
	return false
}

// List returns the sandboxes that match, oldest first.
func (m *Manager) List(f Filter) []Sandbox {
	m.mu.Lock()
	entries := make([]*entry, 0, len(m.boxes))
	for _, e := range m.boxes {
		entries = append(entries, e)
	}
	m.mu.Unlock()
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

// SetTimeout makes the sandbox end d from now: its timeout action (a kill,
// or a pause with autoPause) runs then, and d = 0 runs it at once (E2B's
// set_timeout(0)). A paused sandbox's clock is stopped: d counts from its
// resume, and d = 0 kills it now unless its action is a pause, which has
// already happened (its resume then gives it its create timeout, as after
// a pause at its timeout).
func (m *Manager) SetTimeout(id string, d time.Duration) (Sandbox, error) {
	if err := m.d.Limits.checkTimeout(d); err != nil {
		return Sandbox{}, err
	}
	e, err := m.entry(id)
	if err != nil {
		return Sandbox{}, err
	}
	e.mu.Lock()
	switch e.sb.State {
	case StatePaused:
		if d == 0 && !e.sb.Lifecycle.AutoPause {
			sb := e.sb
			e.mu.Unlock()
			paused := func(sb Sandbox) bool { return sb.State == StatePaused }
			return sb, m.killWhen(context.Background(), e, "", paused)
		}
		defer e.mu.Unlock()
		// Counts from the resume.
		e.sb.Remaining = d
		return e.sb, m.persist(e.sb)
	case StateRunning:
	default:
		defer e.mu.Unlock()
		return Sandbox{}, errdefs.Conflict("sandbox %q is %s", id, e.sb.State)
	}
	defer e.mu.Unlock()
	e.sb.EndAt = time.Now().UTC().Add(d)
	if err := m.persist(e.sb); err != nil {
		return Sandbox{}, err
	}
	// At or past its end, the timer fires at once, on its own goroutine
	// (expire takes e.mu).
	m.armTimer(e)
	return e.sb, nil
}

// Addr implements proxy.Resolver: the address of a running sandbox's port
// and a channel closed when the sandbox goes away.
func (m *Manager) Addr(id string, port int) (string, <-chan struct{}, error) {
	e, err := m.entry(id)
	if err != nil {
		return "", nil, err
	}
	e.mu.Lock()
	sb := e.sb
	var gone <-chan struct{} = e.gone
	e.mu.Unlock()
	if sb.State == StatePaused && sb.Lifecycle.AutoResume && !sb.FilesOnly {
		// Traffic resumes it (E2B's autoResume); concurrent requests
		// queue on the sandbox's lock behind one resume.
		if sb, gone, err = m.wake(e); err != nil {
			return "", nil, err
		}
	}
	if sb.State != StateRunning {
		// Not (yet, or any more) reachable: the proxy answers 502, which
		// the E2B SDK reads as "not running".
		return "", nil, fmt.Errorf("sandbox %q is %s, not running: %w", id, sb.State, errdefs.ErrNotFound)
	}
	return sb.Addr(port), gone, nil
}

// Boot implements proxy.Booter: it changes each time the sandbox boots
// again under its ID (a resume without memory), so that connections
// pooled for one boot are never reused for the next.
func (m *Manager) Boot(id string) uint64 {
	e, err := m.entry(id)
	if err != nil {
		return 0
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.boot
}

func (n Network) egress() (netns.Egress, error) {
	allow, err := netns.ParsePrefixes(n.AllowOut)
	if err != nil {
		return netns.Egress{}, errdefs.Invalid("allowOut: %v", err)
	}
	deny, err := netns.ParsePrefixes(n.DenyOut)
	if err != nil {
		return netns.Egress{}, errdefs.Invalid("denyOut: %v", err)
	}
	return netns.Egress{Internet: n.AllowInternet, Allow: allow, Deny: deny}, nil
}

// SetNetwork changes a sandbox's egress policy while it runs.
func (m *Manager) SetNetwork(ctx context.Context, id string, n Network) (Sandbox, error) {
	eg, err := n.egress()
	if err != nil {
		return Sandbox{}, err
	}
	e, err := m.entry(id)
	if err != nil {
		return Sandbox{}, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.sb.State != StateRunning && e.sb.State != StatePaused {
		return Sandbox{}, errdefs.Conflict("sandbox %q is %s", id, e.sb.State)
	}
	// A sandbox paused without memory has no slot: its next boot applies
	// the policy.
	if !e.sb.FilesOnly {
		if err := m.d.Net.SetEgress(ctx, e.sb.Slot, eg); err != nil {
			return Sandbox{}, err
		}
	}
	e.sb.Network = n
	return e.sb, m.persist(e.sb)
}

// FindByToken implements proxy.SignedFiles: a running or paused sandbox
// whose envd access token match accepts (a signed file URL without a
// sandbox ID is matched against each).
func (m *Manager) FindByToken(match func(token string) bool) (string, bool) {
	m.mu.Lock()
	entries := make([]*entry, 0, len(m.boxes))
	for _, e := range m.boxes {
		entries = append(entries, e)
	}
	m.mu.Unlock()
	for _, e := range entries {
		e.mu.Lock()
		id, token, state := e.sb.ID, e.sb.AccessToken, e.sb.State
		e.mu.Unlock()
		if token != "" && (state == StateRunning || state == StatePaused) && match(token) {
			return id, true
		}
	}
	return "", false
}

// TrafficToken returns the token a sandbox's exposed ports require through
// the proxy ("" when they are public).
func (m *Manager) TrafficToken(id string) string {
	sb, err := m.Get(id)
	if err != nil {
		return ""
	}
	return sb.TrafficToken
}

// Extend makes a running sandbox live at least d from now; it never
// shortens its life (E2B's connect and refresh). Other states are left as
// they are.
func (m *Manager) Extend(id string, d time.Duration) (Sandbox, error) {
	sb, err := m.Get(id)
	if err != nil {
		return Sandbox{}, err
	}
	if sb.State != StateRunning || !time.Now().Add(d).After(sb.EndAt) {
		return sb, nil
	}
	return m.SetTimeout(id, d)
}
