package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/netns"
	"github.com/agentenv/agentenv/internal/runtime"
	"github.com/agentenv/agentenv/internal/snapshot"
)

// source is where a new sandbox comes from when it is not booted fresh: a
// snapshot to restore.
type source struct {
	snap snapshot.Snapshot
	// hold keeps the snapshot in use for the sandbox's life (not for the
	// internal snapshot of a fork, which is deleted after the restores).
	hold bool
	// ready marks a template's ready snapshot: the sandbox is a fresh one
	// of the template (its own limits and environment), only faster.
	ready bool
}

// Create starts a sandbox and returns once envd inside it answers. When
// req.Template names a snapshot, the sandbox is restored from it (as E2B
// does with a snapshot ID in place of a template).
func (m *Manager) Create(ctx context.Context, req CreateRequest) (Sandbox, error) {
	if m.d.Snapshots != nil && m.d.Snapshots.Has(req.Template) {
		sn, err := m.d.Snapshots.Get(req.Template)
		if err != nil {
			return Sandbox{}, err
		}
		if req.Owner != "" && sn.Owner != req.Owner {
			// Another key's snapshot: to this one it does not exist.
			return Sandbox{}, errdefs.NotFound("template or snapshot %q does not exist", req.Template)
		}
		if sn.Runtime != m.d.Runtime.Version() {
			// gVisor restores only what its own build checkpointed.
			return Sandbox{}, errdefs.Conflict("snapshot %s was made by runtime build %q, and this server runs %q: restore it on a server with that build", sn.ID, sn.Runtime, m.d.Runtime.Version())
		}
		m.wantWarm(sn.Template, sn.CPUs, sn.MemoryMB, sn.Nproc, sn.DiskMB, 1)
		return m.create(ctx, req, &source{snap: sn, hold: true})
	}
	if !req.pooled {
		if sb, ok := m.takeHot(ctx, req); ok {
			return sb, nil
		}
	}
	if sn, ok := m.readySnapshot(req.Template); ok {
		sb, err := m.create(ctx, req, &source{snap: sn, ready: true})
		if err == nil || !errors.Is(err, errRestore) {
			return sb, err
		}
		// A ready snapshot that no longer restores (e.g. a new runtime
		// build) must not break creates: drop it and boot.
		m.d.Log.Warn("ready snapshot does not restore; booting instead", "template", req.Template, "snapshot", sn.ID, "err", err)
		m.dropReady(req.Template)
	}
	return m.create(ctx, req, nil)
}

// errRestore marks a failure of the runtime's restore step.
var errRestore = errors.New("restore failed")

func (m *Manager) admit() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return fmt.Errorf("server is shutting down: %w", errdefs.ErrUnavailable)
	}
	// Sandboxes still being torn down hold host resources too.
	if n := len(m.boxes) + len(m.dying); n >= m.d.Limits.MaxSandboxes {
		return fmt.Errorf("limit of %d sandboxes reached (%d still being torn down): kill some first, or retry in a moment: %w",
			m.d.Limits.MaxSandboxes, len(m.dying), errdefs.ErrResourceExhausted)
	}
	m.inflight.Add(1)
	return nil
}

// create runs the create path as a list of steps, each pushing its undo on
// a cleanup stack; boot and restore share every step but the start.
func (m *Manager) create(ctx context.Context, req CreateRequest, src *source) (Sandbox, error) {
	if src != nil && !src.ready {
		// A restored sandbox keeps the snapshotted one's template, limits
		// and environment: they are part of its memory.
		req.Template, req.CPUs, req.MemoryMB, req.EnvVars = src.snap.Template, src.snap.CPUs, src.snap.MemoryMB, src.snap.EnvVars
		if req.Owner == "" {
			req.Owner = src.snap.Owner // a fork child, or the operator restoring a key's snapshot
		}
	}
	if err := m.d.Limits.check(&req); err != nil {
		return Sandbox{}, err
	}
	if req.Network == nil {
		req.Network = &Network{AllowInternet: true}
	}
	egress, err := req.Network.egress()
	if err != nil {
		return Sandbox{}, err
	}
	// The write layer counts at its full size against the disk budget
	// from here (bound to the sandbox's ID below) until its teardown.
	diskMB := m.diskMB(req.Template)
	if src != nil {
		diskMB = src.snap.DiskMB
	}
	layer, err := m.d.Disk.claimLayer(diskMB, fmt.Sprintf("the write layer of a sandbox of template %q", req.Template))
	if err != nil {
		return Sandbox{}, err
	}
	defer layer.release()
	if err := m.admit(); err != nil {
		return Sandbox{}, err
	}
	defer m.inflight.Done()

	var cl cleanup
	image, releaseTemplate, err := m.d.Templates.Acquire(req.Template)
	if err != nil {
		return Sandbox{}, err
	}
	release := releaseTemplate
	cl.add(func(context.Context) error { releaseTemplate(); return nil })

	now := time.Now().UTC()
	sb := Sandbox{
		ID: newID(), Template: req.Template, State: StateCreating,
		Metadata: req.Metadata, EnvVars: req.EnvVars, CPUs: req.CPUs, MemoryMB: req.MemoryMB,
		StartedAt: now, EndAt: now.Add(req.Timeout), AccessToken: newToken(), Network: *req.Network,
		Timeout: req.Timeout, Lifecycle: req.Lifecycle, Owner: req.Owner,
	}
	if req.Network.PrivateTraffic {
		sb.TrafficToken = newToken()
	}
	sb.Nproc = m.d.Limits.nproc(sb.MemoryMB)
	sb.DiskMB = diskMB
	if src != nil {
		// A restore must run with the snapshot's process limit and disk
		// size: gVisor refuses a spec whose rlimits or annotations differ
		// from the checkpoint's.
		sb.Nproc = src.snap.Nproc
	}
	var restoreDir string
	if src != nil {
		dir, done, releaseSnap, err := m.d.Snapshots.Acquire(src.snap.ID)
		if err != nil {
			releaseTemplate()
			return Sandbox{}, err
		}
		defer done()
		restoreDir = dir
		if !src.ready {
			sb.Parent = src.snap.Sandbox
		}
		if src.ready {
			defer releaseSnap()
		} else if src.hold {
			sb.Snapshot = src.snap.ID
			release = func() { releaseTemplate(); releaseSnap() }
		} else {
			// Held only until the restore is done (a fork deletes its
			// internal snapshot after the last child starts).
			defer releaseSnap()
			sb.Snapshot = src.snap.Parent
		}
		cl.add(func(context.Context) error { releaseSnap(); return nil })
	}
	var warm *warmEntry
	if src != nil {
		if warm = m.takeWarm(req.Template, req.CPUs, req.MemoryMB, m.d.Limits.pids(sb.Nproc), sb.DiskMB); warm != nil {
			sb.ID = warm.id
			warm.release() // the sandbox holds the template itself
		}
	}
	log := m.d.Log.With("sandbox", sb.ID, "template", sb.Template)
	fail := func(err error) (Sandbox, error) {
		if cerr := cl.run(ctx); cerr != nil {
			// The answer keeps the create's error class; what could not
			// be removed is retried behind it.
			log.Error("cleanup after failed create; retrying behind", "err", cerr)
			m.retryCleanup(ctx, sb.ID, &cl)
		}
		log.Warn("create failed", "err", err)
		return Sandbox{}, err
	}

	var slot netns.Slot
	if warm != nil {
		slot = warm.slot
	} else if slot, err = m.d.Slots.Get(ctx); err != nil {
		return fail(busy("set up the sandbox's network", err))
	}
	cl.add(func(ctx context.Context) error { return m.d.Slots.Put(ctx, slot) })
	// The container (a warm one, or the one started below) goes before its
	// slot; destroying one that was never made is a no-op.
	cl.add(func(ctx context.Context) error { return m.d.Runtime.Destroy(ctx, sb.ID) })
	sb.Slot = slot

	// Persist before starting the sandbox, so that a crash from here on
	// leaves a record that recovery cleans up.
	if err := os.MkdirAll(m.dir(sb.ID), 0o700); err != nil {
		return fail(err)
	}
	cl.add(func(context.Context) error { return os.RemoveAll(m.dir(sb.ID)) })
	e := newEntry(sb, release)
	if err := m.persist(e.sb); err != nil {
		return fail(err)
	}
	m.mu.Lock()
	m.boxes[sb.ID] = e
	m.mu.Unlock()
	layer.bind(sb.ID)
	cl.add(func(context.Context) error {
		m.mu.Lock()
		delete(m.boxes, sb.ID)
		m.mu.Unlock()
		return nil
	})

	// A warm container's slot has the default policy already (one nft
	// run less on a fork child's path).
	if warm == nil || !defaultNetwork(*req.Network) {
		if err := m.d.Net.SetEgress(ctx, slot, egress); err != nil {
			return fail(busy("apply the egress policy", err))
		}
	}

	tSlot := time.Since(now)
	spec := m.spec(sb, image)
	if src == nil {
		if err := m.d.Runtime.Create(ctx, spec); err != nil {
			return fail(busy("start the sandbox", err))
		}
	} else {
		cp, ok := m.d.Runtime.(runtime.Checkpointer)
		if !ok {
			return fail(fmt.Errorf("this runtime cannot restore snapshots: %w", errdefs.ErrInvalid))
		}
		if err := cp.Restore(ctx, spec, restoreDir); err != nil {
			return fail(busy(fmt.Sprintf("restore snapshot %s", src.snap.ID), fmt.Errorf("%w: %w", errRestore, err)))
		}
	}
	tStart := time.Since(now)
	if err := m.d.Net.Activate(ctx, slot); err != nil {
		return fail(busy("activate the sandbox's network", err))
	}
	tActive := time.Since(now)
	if err := m.waitEnvd(ctx, sb); err != nil {
		return fail(err)
	}
	tEnvd := time.Since(now)
	if src == nil {
		if err := m.runStart(ctx, sb); err != nil {
			return fail(err)
		}
	}
	if src != nil {
		// The restored envd still holds the snapshotted sandbox's token:
		// give this sandbox its own.
		var envs map[string]string
		if src.ready {
			// A fresh sandbox of the template: its own environment.
			envs = readyEnv(sb)
		}
		if err := m.rekey(ctx, sb, src.snap.AccessToken, envs); err != nil {
			return fail(busy("hand the restored sandbox its own token", err))
		}
	}

	e.mu.Lock()
	if req.pooled {
		err = m.move(e, StatePooled)
	} else if err = m.move(e, StateRunning); err == nil {
		m.armTimer(e)
	}
	e.mu.Unlock()
	if err != nil {
		return fail(err)
	}
	cl.keep()
	m.watch(e)
	log.Info("sandbox running", "ip", slot.SandboxIP.String(), "restored", src != nil, "warm", warm != nil, "took", time.Since(now).Round(time.Millisecond),
		"slot", tSlot.Round(time.Millisecond), "start", tStart.Round(time.Millisecond), "network", tActive.Round(time.Millisecond), "envd", tEnvd.Round(time.Millisecond))
	return e.sb, nil
}

// busy classes a failure of a create step that says nothing about the
// request — the sandbox process died while booting, a runtime worker went
// away, the host ran short of something for a moment — as ErrUnavailable
// (503 with Retry-After), saying what failed. The create path has removed
// everything by the time the client reads it, so retrying is safe. An error
// that already has a class keeps it.
func busy(step string, err error) error {
	if errdefs.Classified(err) {
		return fmt.Errorf("%s: %w", step, err)
	}
	return fmt.Errorf("could not %s (nothing of the sandbox was kept; retry): %w: %w", step, err, errdefs.ErrUnavailable)
}
