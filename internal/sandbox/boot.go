package sandbox

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/netns"
	"github.com/agentenv/agentenv/internal/runtime"
	"github.com/agentenv/agentenv/internal/snapshot"
	"github.com/agentenv/agentenv/internal/template"
)

// The boot pipeline. Every way a box comes up — create (boot), restore (a
// user's snapshot, a ready template's, a fork child), reboot (a resume
// without memory) and warm-prepare — is a list of named steps over one
// boot, run by boot.run; variants differ by the steps they list. A step that
// acquires something pushes its undo on the box's stack (cleanup.go); when
// a step fails, what the boot pushed is undone (a sandbox's, retried behind
// the answer like a kill's teardown). Each step is timed — wall, and the
// sandbox's own CPU (its cgroup) once its container exists — into the
// sandbox's record (Sandbox.Boot) and the step observer (/metrics).

// Boot kinds, the kind label of a boot's steps.
const (
	BootCreate  = "create"  // booted from its template
	BootRestore = "restore" // restored from a user's snapshot
	BootReady   = "ready"   // a fresh sandbox restored from its template's ready snapshot
	BootFork    = "fork"    // a fork child
	BootReboot  = "reboot"  // a resume without memory: booted again with its files
	BootWarm    = "warm"    // a warm container prepared for a restore
	BootHot     = "hot"     // a hot pool's sandbox handed out (booted before)
)

// BootRecord says where a sandbox's last boot spent its time.
type BootRecord struct {
	Kind  string     `json:"kind"`
	Steps []StepTime `json:"steps"`
}

// StepTime is one step of a boot.
type StepTime struct {
	Step string        `json:"step"`
	Wall time.Duration `json:"wall"`
	// CPU is the CPU time the sandbox's own processes used during the
	// step (its cgroup); nil where they are not known (before its
	// container exists, or a runtime without cgroups).
	CPU *time.Duration `json:"cpu,omitempty"`
}

// StepObserver is told of every boot step, failed ones included; cpu < 0
// when unknown. It must not block.
type StepObserver func(kind, step string, wall, cpu time.Duration)

// ObserveBootSteps sets the observer of boot steps (nil: none).
func (m *Manager) ObserveBootSteps(fn StepObserver) { m.stepObs.Store(&fn) }

// step is one named step of a boot. cpu marks steps whose time the
// sandbox's own processes take part in (sampled from its cgroup).
type step struct {
	name string
	run  func(*boot, context.Context) error
	cpu  bool
}

// boot is one box being brought up.
type boot struct {
	m    *Manager
	kind string
	req  CreateRequest
	snap *snapshot.Snapshot
	sb   Sandbox
	// e is the sandbox's entry (nil for a warm container); u is the box's
	// undo stack, floor its height when the boot began.
	e     *entry
	u     *undo
	floor int
	// after holds what the boot keeps only while it runs.
	after      []func()
	image      string
	restoreDir string
	egress     netns.Egress
	warm       *warmEntry // the warm container a restore took
	making     *warmEntry // the warm container being prepared
	prep       runtime.Preparer
	container  bool // its container may exist: its cgroup can be sampled
	rec        BootRecord
	start      time.Time

	// pooledToken is the token a hot pool's sandbox's envd holds until
	// the handout rekeys it.
	pooledToken string
}

func (m *Manager) newBoot(kind string, req CreateRequest, snap *snapshot.Snapshot) *boot {
	return &boot{m: m, kind: kind, req: req, snap: snap, u: &undo{}, rec: BootRecord{Kind: kind}}
}

// run runs steps in order. When one fails, what the boot pushed on the
// box's stack is undone: for a box that outlives the boot (a reboot) once,
// leaving what fails on its stack for its next boot or its kill; otherwise
// with retries behind the answer, counted as dying until it is gone.
func (b *boot) run(ctx context.Context, steps []step) error {
	m := b.m
	defer func() {
		for i := len(b.after) - 1; i >= 0; i-- {
			b.after[i]()
		}
	}()
	b.start = time.Now()
	for _, s := range steps {
		if err := b.timed(ctx, s); err != nil {
			m.d.Log.Warn("boot failed", "kind", b.kind, "step", s.name, "sandbox", b.sb.ID, "template", b.sb.Template, "err", err)
			if uerr := m.reap.runUndo(ctx, b.u, b.floor); uerr != nil && b.floor == 0 {
				// The answer keeps the step's error class; what could not
				// be removed is retried behind it.
				m.reap.tearDown(ctx, b.sb, *b.u, false)
			} else if uerr != nil {
				m.d.Log.Error("undo of a failed boot; left for the next boot or the kill", "kind", b.kind, "sandbox", b.sb.ID, "err", uerr)
			}
			return err
		}
	}
	m.d.Log.Info("boot done", "kind", b.kind, "sandbox", b.sb.ID, "template", b.sb.Template, "ip", b.sb.Slot.SandboxIP.String(), "warm", b.warm != nil,
		"took", time.Since(b.start).Round(time.Millisecond), "steps", b.rec.String())
	return nil
}

// timed runs one step and records its wall time and, for a step the
// sandbox's processes take part in, their CPU time (from its cgroup; from
// zero when its container is made by the step).
func (b *boot) timed(ctx context.Context, s step) error {
	var cpu0 time.Duration
	ok0 := true
	if s.cpu && b.container {
		cpu0, ok0 = b.cpuNow(ctx)
	}
	t0 := time.Now()
	err := s.run(b, ctx)
	st := StepTime{Step: s.name, Wall: time.Since(t0)}
	if s.cpu && b.container && ok0 {
		if cpu1, ok := b.cpuNow(ctx); ok {
			d := max(cpu1-cpu0, 0)
			st.CPU = &d
		}
	}
	b.rec.Steps = append(b.rec.Steps, st)
	if fn := b.m.stepObs.Load(); fn != nil && *fn != nil {
		cpu := time.Duration(-1)
		if st.CPU != nil {
			cpu = *st.CPU
		}
		(*fn)(b.kind, s.name, st.Wall, cpu)
	}
	return err
}

// cpuNow is the CPU time the box's cgroup has used.
func (b *boot) cpuNow(ctx context.Context) (time.Duration, bool) {
	st, ok := b.m.d.Runtime.(runtime.Statser)
	if !ok {
		return 0, false
	}
	s, err := st.Stats(ctx, b.sb.ID)
	if err != nil {
		return 0, false
	}
	return s.CPU, true
}

func (r BootRecord) clone() *BootRecord {
	r.Steps = slices.Clone(r.Steps)
	return &r
}

func (r BootRecord) String() string {
	var sb strings.Builder
	for i, s := range r.Steps {
		if i > 0 {
			sb.WriteByte(' ')
		}
		fmt.Fprintf(&sb, "%s=%s", s.Step, s.Wall.Round(100*time.Microsecond))
	}
	return sb.String()
}

// admit checks the request, claims the write layer's disk, counts the
// create in flight and makes the sandbox's record and entry.
func (b *boot) admit(ctx context.Context) error {
	m, req := b.m, &b.req
	m.size.fill(req)
	if err := m.d.Limits.check(req); err != nil {
		return err
	}
	if req.Network == nil {
		req.Network = &Network{AllowInternet: true}
	}
	eg, err := req.Network.egress()
	if err != nil {
		return err
	}
	b.egress = eg
	// The write layer counts as used once the sandbox is listed; until
	// the create ends, what its boot or restore writes into it is
	// reserved.
	diskMB := m.size.diskMB(req.Template)
	if b.snap != nil {
		diskMB = b.snap.DiskMB
	}
	if diskMB > 0 {
		need := int64(layerStartBytes)
		if b.snap != nil {
			// A restore writes back what the snapshotted layer held (as
			// its record says, at most the layer's size).
			need += min(max(b.snap.LayerBytes, 0), int64(diskMB)<<20)
		}
		release, err := m.d.Disk.Reserve(fmt.Sprintf("a new sandbox of template %q", req.Template), need)
		if err != nil {
			return err
		}
		b.after = append(b.after, release)
	}
	if err := m.reg.admit(m.d.Limits.MaxSandboxes); err != nil {
		return err
	}
	b.after = append(b.after, m.reg.inflight.Done)
	b.sb = b.record(diskMB)
	b.e = blankEntry(b.sb)
	b.u = &b.e.undo
	return nil
}

// record is the new sandbox's record, from its request.
func (b *boot) record(diskMB int) Sandbox {
	req := b.req
	now := b.m.d.Clock.Now().UTC()
	sb := Sandbox{
		ID: newID(), Template: req.Template, State: StateCreating,
		Metadata: req.Metadata, EnvVars: req.EnvVars, CPUs: req.CPUs, MemoryMB: req.MemoryMB,
		StartedAt: now, EndAt: now.Add(req.Timeout), AccessToken: newToken(), Network: *req.Network,
		Timeout: req.Timeout, Lifecycle: req.Lifecycle, Owner: req.Owner,
		Nproc: b.m.d.Limits.nproc(req.MemoryMB), DiskMB: diskMB, Volumes: req.Volumes,
	}
	if req.Network.PrivateTraffic {
		sb.TrafficToken = newToken()
	}
	if b.snap != nil {
		// A restore must run with the snapshot's process limit and disk
		// size: gVisor refuses a spec whose rlimits or annotations differ
		// from the checkpoint's.
		sb.Nproc = b.snap.Nproc
	}
	return sb
}

// acquireTemplate takes the template's image; the sandbox holds it for its
// life unless it holds it already (a reboot), then only for the boot.
func (b *boot) acquireTemplate(ctx context.Context) error {
	var image, id string
	var release func()
	var err error
	if b.snap != nil && b.snap.ImageID == "" {
		// A snapshot from before image IDs: it restores only at the path
		// it was taken on, the template's image.erofs (and only while the
		// template keeps those bytes).
		image, release, err = b.m.d.Templates.Acquire(b.sb.Template)
	} else {
		// A restore runs on the stack its snapshot was taken on; a boot
		// on the template's current one.
		want, lowers := "", []string(nil)
		if b.snap != nil {
			want, lowers = b.snap.ImageID, b.snap.Lowers
		}
		var st template.Stack
		st, release, err = b.m.d.Templates.AcquireStack(b.sb.Template, want, lowers)
		image, id, b.sb.Lowers = st.Image, st.ImageID, st.Lowers
	}
	if err != nil {
		return err
	}
	b.image, b.sb.ImageID = image, id
	if b.holds("template") {
		b.after = append(b.after, release)
	} else {
		b.u.push(undoStep{kind: undoRelease, name: "template", fn: release})
	}
	return nil
}

func (b *boot) holds(name string) bool {
	for _, s := range b.u.steps {
		if s.kind == undoRelease && s.name == name {
			return true
		}
	}
	return false
}

// holdSnapshot takes the snapshot to restore for the sandbox's life (a
// restore of a user's snapshot: it cannot be deleted while the sandbox
// lives).
func (b *boot) holdSnapshot(ctx context.Context) error {
	release, err := b.acquireSnapshot()
	if err != nil {
		return err
	}
	b.sb.Snapshot, b.sb.Parent = b.snap.ID, b.snap.Sandbox
	b.u.push(undoStep{kind: undoRelease, name: "snapshot", fn: release})
	return nil
}

// useSnapshot takes the snapshot to restore for the boot only (a ready
// template's, which is replaced at will; a fork's, which the fork deletes
// after its last child started).
func (b *boot) useSnapshot(ctx context.Context) error {
	release, err := b.acquireSnapshot()
	if err != nil {
		return err
	}
	b.after = append(b.after, release)
	return nil
}

// forkSnapshot is useSnapshot for a fork child, which descends from the
// parent's snapshot and the parent.
func (b *boot) forkSnapshot(ctx context.Context) error {
	b.sb.Snapshot, b.sb.Parent = b.snap.Parent, b.snap.Sandbox
	return b.useSnapshot(ctx)
}

func (b *boot) acquireSnapshot() (release func(), err error) {
	dir, done, release, err := b.m.d.Snapshots.Acquire(b.snap.ID)
	if err != nil {
		return nil, err
	}
	b.restoreDir = dir
	b.after = append(b.after, done)
	return release, nil
}

// takeWarm restores into a warm container of the template and limits, if
// there is one: its directory, slot and container become the sandbox's.
func (b *boot) takeWarm(ctx context.Context) error {
	m := b.m
	if len(b.sb.Volumes) > 0 {
		// A warm container was prepared without them.
		return nil
	}
	if t, err := m.d.Templates.Get(b.sb.Template); err != nil || t.ImageID != b.sb.ImageID || !slices.Equal(t.Lowers, b.sb.Lowers) {
		// A snapshot of an image (or stack) the template has left: warm
		// containers are prepared on its current one.
		return nil
	}
	w := m.takeWarm(b.sb.Template, b.sb.CPUs, b.sb.MemoryMB, m.d.Limits.pids(b.sb.Nproc), b.sb.DiskMB)
	if w == nil {
		return nil
	}
	// The sandbox holds the template itself.
	m.reap.runUndo(ctx, &w.undo, 0, undoRelease)
	b.warm, b.container = w, true
	b.sb.ID, b.u.id = w.id, w.id
	b.sb.Slot = w.slot
	w.undo.moveTo(b.u)
	return nil
}

// takeSlot gives the box a network slot (unless a warm container brought
// one). Its directory and container go after the slot, so that a slot is
// never freed while a container that failed to go may use it.
func (b *boot) takeSlot(ctx context.Context) error {
	if b.warm != nil {
		return nil
	}
	if !b.u.has(undoDir) {
		b.u.push(undoStep{kind: undoDir})
	}
	slot, err := b.m.d.Slots.Get(ctx)
	if err != nil {
		return busy("set up the sandbox's network", err)
	}
	b.u.push(undoStep{kind: undoSlot, slot: slot})
	// Destroying a container that was never made is a no-op.
	b.u.push(undoStep{kind: undoContainer})
	b.sb.Slot = slot
	return nil
}

// persist writes the record before the sandbox starts, so that a crash
// from here on leaves one that recovery cleans up, and lists the sandbox.
func (b *boot) persist(ctx context.Context) error {
	m := b.m
	if err := os.MkdirAll(m.rec.dir(b.sb.ID), 0o700); err != nil {
		return err
	}
	b.e.sb = b.sb
	if err := m.rec.write(b.sb); err != nil {
		return err
	}
	m.reg.add(b.e)
	b.u.push(undoStep{kind: undoListed})
	return nil
}

// adopt lists a sandbox found after a restart, holding its snapshot (if
// it still exists) and, through releaseTemplate, its template.
func (m *Manager) adopt(sb Sandbox, releaseTemplate func()) *entry {
	releaseSnap := func() {}
	if sb.Snapshot != "" && m.d.Snapshots != nil && m.d.Snapshots.Has(sb.Snapshot) {
		releaseSnap = m.d.Snapshots.Hold(sb.Snapshot)
	}
	e := newEntry(sb, func() { releaseTemplate(); releaseSnap() })
	m.reg.add(e)
	return e
}

// applyEgress sets the sandbox's egress policy. A warm container's slot
// and a pooled sandbox's have the default policy already (one nft run
// less on a fork child's path and a hot create's).
func (b *boot) applyEgress(ctx context.Context) error {
	if (b.warm != nil || b.kind == BootHot) && defaultNetwork(b.sb.Network) {
		return nil
	}
	if err := b.m.d.Net.SetEgress(ctx, b.sb.Slot, b.egress); err != nil {
		return busy("apply the egress policy", err)
	}
	return nil
}

// bootRuntime starts the sandbox's container from its template.
func (b *boot) bootRuntime(ctx context.Context) error {
	b.container = true
	if err := b.m.d.Runtime.Create(ctx, b.m.spec(b.sb, b.image)); err != nil {
		return busy("start the sandbox", err)
	}
	return nil
}

// restoreRuntime starts the sandbox's container from the snapshot.
func (b *boot) restoreRuntime(ctx context.Context) error {
	cp, ok := b.m.d.Runtime.(runtime.Checkpointer)
	if !ok {
		return fmt.Errorf("this runtime cannot restore snapshots: %w", errdefs.ErrInvalid)
	}
	b.container = true
	if err := cp.Restore(ctx, b.m.spec(b.sb, b.image), b.restoreDir); err != nil {
		return busy(fmt.Sprintf("restore snapshot %s", b.snap.ID), fmt.Errorf("%w: %w", errRestore, err))
	}
	return nil
}

func (b *boot) activate(ctx context.Context) error {
	if err := b.m.d.Net.Activate(ctx, b.sb.Slot); err != nil {
		return busy("activate the sandbox's network", err)
	}
	return nil
}

func (b *boot) waitEnvd(ctx context.Context) error { return waitEnvd(ctx, b.m.envd, b.sb) }

// startCommand runs the template's start command (on a reboot, over the
// files the sandbox had, as a boot from its disk would).
func (b *boot) startCommand(ctx context.Context) error { return b.m.runStart(ctx, b.sb) }

// rekey gives the restored envd, which still holds the snapshotted
// sandbox's token, this sandbox's own.
func (b *boot) rekey(ctx context.Context) error { return b.rekeyWith(ctx, nil) }

// rekeyFresh is rekey for a fresh sandbox of the template (a ready
// snapshot's): it gets its own environment too.
func (b *boot) rekeyFresh(ctx context.Context) error { return b.rekeyWith(ctx, readyEnv(b.sb)) }

func (b *boot) rekeyWith(ctx context.Context, env map[string]string) error {
	if err := rekey(ctx, b.m.envd, b.sb, b.snap.AccessToken, env); err != nil {
		return busy("hand the restored sandbox its own token", err)
	}
	return nil
}

// running makes the sandbox running (with its timer) or pooled.
func (b *boot) running(ctx context.Context) error {
	e := b.e
	e.mu.Lock()
	defer e.mu.Unlock()
	e.sb.Boot = b.rec.clone()
	if b.req.pooled {
		return b.m.rec.move(e, StatePooled)
	}
	if err := b.m.rec.move(e, StateRunning); err != nil {
		return err
	}
	b.m.armTimer(e)
	return nil
}

// watch starts the death watch.
func (b *boot) watch(ctx context.Context) error {
	b.m.watch(b.e)
	return nil
}

// The step lists.
var (
	admitStep = step{"admit", (*boot).admit, false}
	tmplStep  = step{"template", (*boot).acquireTemplate, false}
	warmStep  = step{"warm", (*boot).takeWarm, false}
	slotStep  = step{"slot", (*boot).takeSlot, false}
	recStep   = step{"persist", (*boot).persist, false}
	egStep    = step{"egress", (*boot).applyEgress, false}
	netStep   = step{"network", (*boot).activate, true}
	envdStep  = step{"envd", (*boot).waitEnvd, true}
	startStep = step{"start", (*boot).startCommand, true}
	runStep   = step{"running", (*boot).running, false}
	watchStep = step{"watch", (*boot).watch, false}

	createSteps = []step{admitStep, tmplStep, slotStep, recStep, egStep,
		{"boot", (*boot).bootRuntime, true}, netStep, envdStep, startStep, runStep, watchStep}
	restoreSteps = restoreList(step{"snapshot", (*boot).holdSnapshot, false}, step{"rekey", (*boot).rekey, true})
	readySteps   = restoreList(step{"snapshot", (*boot).useSnapshot, false}, step{"rekey", (*boot).rekeyFresh, true})
	forkSteps    = restoreList(step{"snapshot", (*boot).forkSnapshot, false}, step{"rekey", (*boot).rekey, true})
)

// restoreList is the steps of a restore: they differ by how long the
// snapshot is held and what the restored envd is told. There is no envd
// step: the rekey waits for envd (envdclient.Init connects as Wait does)
// and its answer is envd's first, which saves a request per restore.
func restoreList(snap, rekey step) []step {
	return []step{admitStep, tmplStep, snap, warmStep, slotStep, recStep, egStep,
		{"restore", (*boot).restoreRuntime, true}, netStep, rekey, runStep, watchStep}
}

// newSandbox runs a create's steps and returns the new sandbox.
func (b *boot) newSandbox(ctx context.Context, steps []step) (Sandbox, error) {
	if err := b.run(ctx, steps); err != nil {
		return Sandbox{}, err
	}
	b.e.mu.Lock()
	defer b.e.mu.Unlock()
	b.e.sb.Boot = b.rec.clone()
	return b.e.sb, nil
}

// restoreBoot is a boot from snapshot sn: a restore of a user's snapshot
// or a fork child keeps the snapshotted sandbox's template, limits and
// environment (they are part of its memory).
func (m *Manager) restoreBoot(kind string, req CreateRequest, sn snapshot.Snapshot) *boot {
	if kind != BootReady {
		req.Template, req.CPUs, req.MemoryMB, req.EnvVars, req.Volumes = sn.Template, sn.CPUs, sn.MemoryMB, sn.EnvVars, sn.Volumes
		if req.Owner == "" {
			req.Owner = sn.Owner // a fork child, or the operator restoring a key's snapshot
		}
	}
	return m.newBoot(kind, req, &sn)
}
