package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/snapshot"
)

// Create starts a sandbox and returns once envd inside it answers. When
// req.Template names a snapshot, the sandbox is restored from it (as E2B
// does with a snapshot ID in place of a template).
func (m *Manager) Create(ctx context.Context, req CreateRequest) (Sandbox, error) {
	if m.d.Snapshots != nil && m.d.Snapshots.Has(req.Template) {
		return m.restore(ctx, req)
	}
	// Hot sandboxes and ready snapshots were made without volumes.
	if !req.pooled && len(req.Volumes) == 0 {
		if sb, ok := m.takeHot(ctx, req); ok {
			return sb, nil
		}
	}
	if sn, ok := m.readySnapshot(req.Template); ok && len(req.Volumes) == 0 {
		sb, err := m.restoreBoot(BootReady, req, sn).newSandbox(ctx, readySteps)
		if err == nil || !errors.Is(err, errRestore) {
			return sb, err
		}
		// A ready snapshot that no longer restores (e.g. a new runtime
		// build) must not break creates: drop it and boot.
		m.d.Log.Warn("ready snapshot does not restore; booting instead", "template", req.Template, "snapshot", sn.ID, "err", err)
		m.dropReady(req.Template)
	}
	return m.newBoot(BootCreate, req, nil).newSandbox(ctx, createSteps)
}

// restore is a create from the snapshot req.Template names.
func (m *Manager) restore(ctx context.Context, req CreateRequest) (Sandbox, error) {
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
	if err := volumesExist(sn); err != nil {
		return Sandbox{}, err
	}
	if len(sn.Volumes) == 0 { // a restore with volumes takes no warm container
		m.wantWarm(sn.Template, sn.CPUs, sn.MemoryMB, sn.Nproc, sn.DiskMB, 1)
	}
	return m.restoreBoot(BootRestore, req, sn).newSandbox(ctx, restoreSteps)
}

// volumesExist tells whether the volumes snapshot sn mounted are still
// there: its restore mounts them again.
func volumesExist(sn snapshot.Snapshot) error {
	for _, v := range sn.Volumes {
		if _, err := os.Stat(v.Source); err != nil {
			return errdefs.NotFound("volume '%s' that snapshot %s mounted at %s was deleted: the snapshot cannot be restored without it", v.Name, sn.ID, v.Path)
		}
	}
	return nil
}

// errRestore marks a failure of the runtime's restore step.
var errRestore = errors.New("restore failed")

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
