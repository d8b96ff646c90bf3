package sandbox

import (
	"context"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentenv/agentenv/internal/dialer"
	"github.com/agentenv/agentenv/internal/envdapi"
	"github.com/agentenv/agentenv/internal/envdclient"
	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/netns"
	"github.com/agentenv/agentenv/internal/runtime"
	"github.com/agentenv/agentenv/internal/sandbox/spare"
	"github.com/agentenv/agentenv/internal/snapshot"
	"github.com/agentenv/agentenv/internal/template"
	"github.com/agentenv/agentenv/internal/volume"
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
	// Clock runs the sandboxes' timeouts (nil: the real clock).
	Clock Clock
	// Envd speaks to the sandboxes' daemons; nil: an envdclient.Client
	// over the marked dialer.
	Envd Envd
}

// Manager creates, tracks and kills sandboxes.
type Manager struct {
	d Deps
	// dialer opens every connection to a sandbox (client, proxy): it sets
	// the server's socket mark, without which the firewall refuses them.
	dialer *dialer.Dialer
	envd   Envd

	// mu orders a pooled sandbox's leaving the hot pool with its being
	// counted as dying (kill, Unlisted). Lock order: mu, then a pool's own
	// lock (the pools never call into the manager while holding theirs),
	// then the registry's (innermost).
	mu sync.Mutex
	// reg is the table of sandboxes, with its own lock (registry.go).
	reg registry
	// rec is what is persisted of each sandbox (records.go).
	rec records
	// size is what a template's new sandboxes get (size.go).
	size sizes
	cpu  cpuSamples // metrics: the last CPU sample of each sandbox

	// warm and hot are the pools of spares (package spare; warm.go,
	// hot.go, spares.go), each with its own lock, kick channel and spares
	// being made.
	warm spare.Warm[warmEntry]
	hot  spare.Hot
	// reaped counts the sandboxes killed by their timeout (for /metrics).
	reaped atomic.Int64

	// prep marks the templates being built, made ready or deleted
	// (ready.go): the pools leave them alone.
	prep preparing

	// reap tears boxes down (reaper.go).
	reap reaper
	// stepObs is told of every boot step (boot.go).
	stepObs atomic.Pointer[StepObserver]
	// ends tells an observer of every sandbox end (ends.go).
	ends endNotes
}

// entry is a live sandbox with its runtime-only parts.
type entry struct {
	mu    sync.Mutex // serialises lifecycle operations on this sandbox
	sb    Sandbox
	timer Timer
	// undo gives back what the sandbox holds (cleanup.go); kill runs it.
	undo undo
	// volumes are the IDs of the volumes it mounts: set before the entry
	// is listed and never changed, so read without mu (VolumeUsers).
	volumes []string
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

// newEntry is the entry of an existing sandbox record (adopted after a
// restart): its undo holds all a sandbox holds, release last.
func newEntry(sb Sandbox, release func()) *entry {
	e := blankEntry(sb)
	e.undo = recordUndo(sb, release)
	return e
}

// blankEntry is an entry that holds nothing yet (a boot fills its undo).
func blankEntry(sb Sandbox) *entry {
	e := &entry{sb: sb, undo: undo{id: sb.ID}, gone: make(chan struct{}), bootAt: time.Now()}
	for _, v := range sb.Volumes {
		e.volumes = append(e.volumes, v.ID)
	}
	return e
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
	if d.Clock == nil {
		d.Clock = realClock{}
	}
	var mark dialer.MarkFunc
	if d.Net != nil {
		mark = d.Net.MarkSocket
	}
	dial := dialer.New(mark)
	if d.Envd == nil {
		d.Envd = envdclient.New(dial.DialContext, d.Log)
	}
	m := &Manager{
		d:      d,
		rec:    records{root: d.Dir, onPersist: d.OnPersist},
		size:   sizes{templates: d.Templates, limits: d.Limits},
		dialer: dial,
		envd:   d.Envd,
	}
	m.reap = newReaper(&m.reg, m.rec, d)
	m.initPools()
	return m, nil
}

// initPools gives the warm and hot pools what they need of the manager.
func (m *Manager) initPools() {
	names := func() []string {
		var out []string
		for _, t := range m.d.Templates.List() {
			out = append(out, t.Name)
		}
		return out
	}
	prep, canPrepare := m.d.Runtime.(runtime.Preparer)
	m.warm.Init(spare.Host[warmEntry]{
		Size: m.d.WarmPool, Off: !canPrepare, Log: m.d.Log, Templates: names, Preparing: m.prep.has,
		Make: func(ctx context.Context, template string) error { return m.prepareWarm(ctx, prep, template) },
		Drop: m.dropWarm,
	})
	m.warm.Ready = m.IsReady
	m.hot.Init(spare.Host[string]{
		Size: m.d.Limits.HotPool, Log: m.d.Log, Templates: names, Preparing: m.prep.has,
		Make: func(ctx context.Context, template string) error {
			sb, err := m.Create(ctx, CreateRequest{Template: template, Timeout: m.d.Limits.MaxTimeout, pooled: true})
			if err == nil {
				m.hot.Add(template, sb.ID)
			}
			return err
		},
		Drop: func(ctx context.Context, id string) { m.Kill(ctx, id) },
	})
}

// DialSandbox connects to a sandbox's address (from Addr) with the
// server's socket mark (netns.Manager.MarkSocket): the host firewall
// refuses connections to sandboxes without it. The proxy dials with it.
func (m *Manager) DialSandbox(ctx context.Context, network, addr string) (net.Conn, error) {
	return m.dialer.DialContext(ctx, network, addr)
}

func (m *Manager) spec(sb Sandbox, image string) runtime.Spec {
	env := []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"E2B_SANDBOX=true",
		"E2B_SANDBOX_ID=" + sb.ID,
		"E2B_TEMPLATE_ID=" + sb.Template,
		envdapi.TokenEnv + "=" + sb.AccessToken,
	}
	env, args := m.templateProcess(sb, env)
	return runtime.Spec{
		ID:       sb.ID,
		Dir:      m.rec.dir(sb.ID),
		Image:    image,
		Lowers:   m.d.Templates.LayerPaths(sb.Lowers),
		Args:     args,
		Env:      env,
		NetNS:    sb.Slot.Path(),
		CPUs:     float64(sb.CPUs),
		MemoryMB: int64(sb.MemoryMB),
		DiskMB:   int64(sb.DiskMB),
		Pids:     m.d.Limits.pids(sb.Nproc),
		Hostname: "e2b",
		Binds:    binds(sb.Volumes),
	}
}

// binds are the host directories of a sandbox's volumes.
func binds(vols []volume.Mount) []runtime.Bind {
	var out []runtime.Bind
	for _, v := range vols {
		out = append(out, runtime.Bind{Source: v.Source, Destination: v.Path})
	}
	return out
}

// VolumeUsers names the sandboxes (in any state but gone) that mount
// volume id: a volume they mount must not be deleted.
func (m *Manager) VolumeUsers(id string) []string {
	out := m.reg.mounting(id)
	slices.Sort(out)
	return out
}

// EnvdAddr is the host-reachable address of a sandbox's port.
func (sb Sandbox) Addr(port int) string {
	return net.JoinHostPort(sb.Slot.SandboxIP.String(), strconv.Itoa(port))
}

// armTimer (re)schedules the sandbox's timeout: a kill, or a pause when
// its lifecycle says so (expire). Callers hold e.mu.
func (m *Manager) armTimer(e *entry) {
	if e.timer != nil {
		e.timer.Stop()
	}
	e.timer = m.d.Clock.AfterFunc(e.sb.EndAt.Sub(m.d.Clock.Now()), func() { m.expire(e) })
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
	e, err := m.reg.lookup(id)
	if err != nil {
		return Sandbox{}, err
	}
	e.mu.Lock()
	switch e.sb.State {
	case StatePaused, StatePausedFiles:
		if d == 0 && !e.sb.Lifecycle.AutoPause {
			sb := e.sb
			e.mu.Unlock()
			paused := func(sb Sandbox) bool { return sb.State.Paused() }
			return sb, m.killWhen(context.Background(), e, death{}, paused)
		}
		defer e.mu.Unlock()
		// Counts from the resume.
		e.sb.Remaining = d
		return e.sb, m.rec.write(e.sb)
	case StateRunning:
	default:
		defer e.mu.Unlock()
		return Sandbox{}, errdefs.Conflict("sandbox %q is %s", id, e.sb.State)
	}
	defer e.mu.Unlock()
	e.sb.EndAt = m.d.Clock.Now().UTC().Add(d)
	if err := m.rec.write(e.sb); err != nil {
		return Sandbox{}, err
	}
	// At or past its end, the timer fires at once, on its own goroutine
	// (expire takes e.mu).
	m.armTimer(e)
	return e.sb, nil
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
	e, err := m.reg.lookup(id)
	if err != nil {
		return Sandbox{}, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.sb.State.Live() {
		return Sandbox{}, errdefs.Conflict("sandbox %q is %s", id, e.sb.State)
	}
	// A sandbox paused without memory has no slot: its next boot applies
	// the policy.
	if e.sb.State.hasContainer() {
		if err := m.d.Net.SetEgress(ctx, e.sb.Slot, eg); err != nil {
			return Sandbox{}, err
		}
	}
	e.sb.Network = n
	return e.sb, m.rec.write(e.sb)
}

// Extend makes a running sandbox live at least d from now; it never
// shortens its life (E2B's connect and refresh). Other states are left as
// they are.
func (m *Manager) Extend(id string, d time.Duration) (Sandbox, error) {
	sb, err := m.Get(id)
	if err != nil {
		return Sandbox{}, err
	}
	if sb.State != StateRunning || !m.d.Clock.Now().Add(d).After(sb.EndAt) {
		return sb, nil
	}
	return m.SetTimeout(id, d)
}
