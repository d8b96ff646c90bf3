package sandbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/runtime"
	"github.com/agentenv/agentenv/internal/snapshot"
)

// Pause freezes a running sandbox in place: its processes stop, it uses no
// CPU, and the time it spends paused does not count against its timeout.
func (m *Manager) Pause(ctx context.Context, id string) (Sandbox, error) {
	return m.pause(ctx, id, m.pauseLocked)
}

// PauseFiles pauses a running sandbox keeping only its files (E2B's pause
// with memory: false): its processes end and its memory is freed; a
// resume boots it again with the files it had.
func (m *Manager) PauseFiles(ctx context.Context, id string) (Sandbox, error) {
	return m.pause(ctx, id, m.pauseFilesLocked)
}

func (m *Manager) pause(ctx context.Context, id string, how func(context.Context, *entry) error) (Sandbox, error) {
	e, err := m.reg.lookup(id)
	if err != nil {
		return Sandbox{}, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.sb.State.Paused() {
		return Sandbox{}, errdefs.Conflict("sandbox %q is already paused", id)
	}
	if e.sb.State != StateRunning {
		return Sandbox{}, errdefs.Conflict("sandbox %q is %s and cannot be paused", id, e.sb.State)
	}
	if err := how(ctx, e); err != nil {
		return Sandbox{}, err
	}
	return e.sb, nil
}

// Resume continues a paused sandbox (boots it again with its files when
// it was paused without memory). Its timeout restarts with timeout when
// that is not zero, else with the time it had left (its create timeout
// when it was paused by its timeout).
func (m *Manager) Resume(ctx context.Context, id string, timeout time.Duration) (Sandbox, error) {
	if timeout != 0 {
		if err := m.d.Limits.checkTimeout(timeout); err != nil {
			return Sandbox{}, err
		}
	}
	e, err := m.reg.lookup(id)
	if err != nil {
		return Sandbox{}, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := m.resumeLocked(ctx, e, timeout); err != nil {
		return Sandbox{}, err
	}
	return e.sb, nil
}

// SnapshotRequest names and describes a new snapshot.
type SnapshotRequest struct {
	Name     string
	Metadata map[string]string
	// Automatic: agentenv asks for it for its own use (a fleet fork
	// spilling over its parent's node), not a user: the retention policy
	// collects it. A user's snapshot is kept until deleted.
	Automatic bool
	internal  bool
}

// kind is the snapshot kind the request makes.
func (r SnapshotRequest) kind() string {
	if r.internal || r.Automatic {
		return snapshot.KindAuto
	}
	return snapshot.KindUser
}

// Snapshot saves a running sandbox (memory, processes, filesystem changes)
// as a snapshot; the sandbox keeps running.
func (m *Manager) Snapshot(ctx context.Context, id string, req SnapshotRequest) (snapshot.Snapshot, error) {
	sn, _, err := m.snapshot(ctx, id, req, false)
	return sn, err
}

// snapshot is Snapshot; with hold, the snapshot arrives in the store held
// until release (nil without hold), so that the collector cannot take a
// fork's checkpoint before its children restore it.
func (m *Manager) snapshot(ctx context.Context, id string, req SnapshotRequest, hold bool) (_ snapshot.Snapshot, release func(), _ error) {
	cp, ok := m.d.Runtime.(runtime.Checkpointer)
	if !ok || m.d.Snapshots == nil {
		return snapshot.Snapshot{}, nil, fmt.Errorf("snapshots are not available with this runtime: %w", errdefs.ErrInvalid)
	}
	if len(req.Name) > 128 {
		return snapshot.Snapshot{}, nil, errdefs.Invalid("snapshot name is longer than 128 characters")
	}
	if !req.internal && strings.HasPrefix(req.Name, readyPrefix) {
		return snapshot.Snapshot{}, nil, errdefs.Invalid("snapshot name %q: names starting with %q are reserved for the server's ready templates; choose another name", req.Name, readyPrefix)
	}
	e, err := m.reg.lookup(id)
	if err != nil {
		return snapshot.Snapshot{}, nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.sb.State != StateRunning {
		return snapshot.Snapshot{}, nil, errdefs.Conflict("sandbox %q is %s: only a running sandbox can be snapshotted (resume it first)", id, e.sb.State)
	}
	if req.kind() == snapshot.KindUser {
		// A user's snapshot is kept until deleted: a full store refuses
		// it rather than collect another user's.
		admitted, err := m.d.Snapshots.Admit()
		if err != nil {
			return snapshot.Snapshot{}, nil, fmt.Errorf("snapshot of sandbox %s: %w", id, err)
		}
		defer admitted()
	}
	// The checkpoint holds at most the sandbox's memory and what its
	// write layer holds; once stored, the snapshot store counts it.
	reserved, err := m.d.Disk.Reserve(fmt.Sprintf("a snapshot of sandbox %s", id), int64(e.sb.MemoryMB)<<20+m.LayerBytes(id))
	if err != nil {
		return snapshot.Snapshot{}, nil, err
	}
	defer reserved()
	dir, err := m.d.Snapshots.TempDir()
	if err != nil {
		return snapshot.Snapshot{}, nil, err
	}
	start := time.Now()
	if err := cp.Checkpoint(ctx, id, dir); err != nil {
		return snapshot.Snapshot{}, nil, err
	}
	checkpointed := time.Since(start)
	// The store keeps only the pages this sandbox's previous snapshot
	// lacks (see internal/snapshot).
	meta := snapshot.Snapshot{
		Name: req.Name, Metadata: req.Metadata, Template: e.sb.Template, ImageID: e.sb.ImageID, Lowers: e.sb.Lowers, Parent: e.sb.Snapshot,
		Sandbox: id, Runtime: m.d.Runtime.Version(), Internal: req.internal, Kind: req.kind(), Owner: e.sb.Owner,
		CPUs: e.sb.CPUs, MemoryMB: e.sb.MemoryMB, Nproc: e.sb.Nproc, DiskMB: e.sb.DiskMB, LayerBytes: m.LayerBytes(id), Volumes: e.sb.Volumes, EnvVars: e.sb.EnvVars, AccessToken: e.sb.AccessToken,
	}
	var sn snapshot.Snapshot
	if hold {
		sn, release, err = m.d.Snapshots.AddHeld(dir, meta)
	} else {
		sn, err = m.d.Snapshots.Add(dir, meta)
	}
	if err != nil {
		return snapshot.Snapshot{}, nil, err
	}
	m.d.Log.Info("snapshot taken", "sandbox", id, "snapshot", sn.ID, "bytes", sn.Size, "stored", sn.Stored,
		"took", time.Since(start).Round(time.Millisecond), "checkpoint", checkpointed.Round(time.Millisecond),
		"hash", sn.Timing.Hash.Round(time.Millisecond), "write", sn.Timing.Write.Round(time.Millisecond))
	return sn, release, nil
}

// ForkResult is one child of a fork: a sandbox or why it failed.
type ForkResult struct {
	Sandbox Sandbox
	Err     error
}

// Fork snapshots a running sandbox and restores it count times. Children
// continue from the parent's state at that moment and are isolated from it
// and from each other; the parent keeps running.
func (m *Manager) Fork(ctx context.Context, id string, count int, timeout time.Duration, metadata map[string]string) ([]ForkResult, error) {
	if count < 1 || count > m.d.Limits.MaxFork {
		return nil, errdefs.Invalid("fork count %d out of range: give 1..%d", count, m.d.Limits.MaxFork)
	}
	parent, err := m.Get(id)
	if err != nil {
		return nil, err
	}
	if err := m.admitFork(parent, count); err != nil {
		return nil, err
	}
	sn, held, err := m.snapshot(ctx, id, SnapshotRequest{internal: true}, true)
	if err != nil {
		return nil, err
	}
	defer func() {
		held() // the children hold it while they restore
		if err := m.d.Snapshots.Delete(sn.ID); err != nil {
			m.d.Log.Error("delete fork snapshot", "snapshot", sn.ID, "err", err)
		}
	}()
	if metadata == nil {
		metadata = parent.Metadata
	}
	// Every child at once: the runtime's workers bound how many restores
	// run together, and children that find a warm container (see warm.go)
	// skip the sandbox start-up.
	if len(sn.Volumes) == 0 { // children with volumes take no warm container
		m.wantWarm(sn.Template, sn.CPUs, sn.MemoryMB, sn.Nproc, sn.DiskMB, count)
	}
	results := make([]ForkResult, count)
	var wg sync.WaitGroup
	for i := range count {
		wg.Go(func() {
			network := parent.Network
			sb, err := m.restoreBoot(BootFork, CreateRequest{Timeout: timeout, Metadata: metadata, Network: &network}, sn).newSandbox(ctx, forkSteps)
			results[i] = ForkResult{Sandbox: sb, Err: err}
		})
	}
	wg.Wait()
	var errs []error
	for _, r := range results {
		if r.Err != nil {
			errs = append(errs, r.Err)
		}
	}
	if len(errs) == count {
		return results, fmt.Errorf("every fork child failed: %w", errors.Join(errs...))
	}
	return results, nil
}

// admitFork refuses, as a whole, a fork whose children do not all fit on
// this node (sandbox count, disk budget): a group of continuations is
// wanted whole, and a part of it would only cost restores. Creates racing
// the fork can still take the room; then single children fail.
func (m *Manager) admitFork(parent Sandbox, count int) error {
	live, dying := m.reg.count()
	used := live + dying
	if free := m.d.Limits.MaxSandboxes - used; count > free {
		return fmt.Errorf("fork of %d children refused: this node runs %d of its %d sandboxes (--max-sandboxes), room for %d: fork fewer, or kill sandboxes first: %w",
			count, used, m.d.Limits.MaxSandboxes, max(free, 0), errdefs.ErrResourceExhausted)
	}
	if parent.DiskMB <= 0 {
		return nil // layers in memory
	}
	// Each child's layer starts as a copy of the parent's (as used, not
	// its size: thin provisioning), with the checkpoint the fork takes.
	layer := m.LayerBytes(parent.ID) + layerStartBytes
	need := int64(count)*layer + int64(parent.MemoryMB)<<20
	return m.d.Disk.fits(need, fmt.Sprintf("a fork of %d children (each child's write layer starts with the parent's %s, and the parent's checkpoint)", count, FormatBytes(layer)))
}

// DeleteSnapshot deletes a snapshot that nothing needs.
func (m *Manager) DeleteSnapshot(id string) error {
	if m.d.Snapshots == nil {
		return errdefs.NotFound("snapshot %q does not exist", id)
	}
	m.reap.settle(func(sb Sandbox) bool { return sb.Snapshot == id })
	return m.d.Snapshots.Delete(id)
}
