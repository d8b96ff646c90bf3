package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/agentenv/agentenv/internal/runtime"
)

// Recover reconciles the records on disk with what exists on the host after
// a restart (clean or not): running sandboxes whose container and envd are
// alive are adopted; every other record is cleaned up and kept as a "lost"
// tombstone with its reason; containers and network slots that no record
// owns are removed. It returns the adopted and lost sandboxes.
func (m *Manager) Recover(ctx context.Context) (adopted, lost []Sandbox, err error) {
	entries, err := os.ReadDir(m.d.Dir)
	if err != nil {
		return nil, nil, err
	}
	for _, de := range entries {
		if !de.IsDir() || de.Name() == "lost" {
			continue
		}
		switch sb, r := m.recoverOne(ctx, de.Name()); r {
		case recoveredAdopted:
			adopted = append(adopted, sb)
		case recoveredLost:
			lost = append(lost, sb)
		}
	}
	// Containers and slots that no record owns: a crash between their
	// creation and the first record write, or a record deleted by hand.
	if err := m.reap.removeStrayContainers(ctx); err != nil {
		return adopted, lost, err
	}
	if err := m.reap.removeStraySlots(ctx); err != nil {
		return adopted, lost, err
	}
	for _, sb := range m.rec.tombstones() {
		m.reg.bury(sb)
	}
	return adopted, lost, nil
}

// recovery is what Recover made of one sandbox directory.
type recovery int

const (
	recoveredNone    recovery = iota // removed or torn down: not a sandbox any more
	recoveredAdopted                 // running (or paused) on, as before the restart
	recoveredLost                    // cleaned up, kept as a tombstone with its reason
)

// recoverOne reconciles the sandbox directory id with the host.
func (m *Manager) recoverOne(ctx context.Context, id string) (Sandbox, recovery) {
	if _, err := os.Stat(filepath.Join(m.rec.dir(id), warmMarker)); err == nil {
		// A warm container of the last run: its container and slot go as
		// strays.
		os.RemoveAll(m.rec.dir(id))
		return Sandbox{}, recoveredNone
	}
	sb, rerr := m.rec.read(id)
	if rerr != nil {
		// No usable record: nothing is known of it but its files and a
		// container of the same ID, which teardown removes.
		sb = Sandbox{ID: id}
		m.markLost(ctx, sb, fmt.Sprintf("its record was unreadable after a restart (%v)", rerr))
		return sb, recoveredLost
	}
	if sb.State == StatePooled || sb.State == StateKilling {
		// Booted for the hot pool of the last run (nobody has it), or
		// killed and not yet torn down when the server stopped: finish the
		// job; a failure is retried behind the start.
		if sb.Slot.Namespace != "" {
			m.d.Slots.MarkUsed(sb.Slot.Index)
		}
		m.reap.tearDown(ctx, sb, recordUndo(sb, m.acquireTemplate(sb)), true)
		return Sandbox{}, recoveredNone
	}
	if m.adoptFilesOnly(sb) {
		return sb, recoveredAdopted
	}
	if reason := m.alive(ctx, sb); reason != "" {
		sb.Reason = reason
		m.markLost(ctx, sb, reason)
		return sb, recoveredLost
	}
	m.adoptLive(ctx, sb)
	return sb, recoveredAdopted
}

// acquireTemplate holds a recovered sandbox's template and the layers it
// booted on; the release does nothing for a template that is gone.
func (m *Manager) acquireTemplate(sb Sandbox) func() {
	layers := m.d.Templates.HoldLayers(sb.Lowers)
	if _, rel, err := m.d.Templates.Acquire(sb.Template); err == nil {
		return func() { rel(); layers() }
	}
	return layers
}

// adoptLive takes over a sandbox whose container and envd survived the
// restart: its egress policy back in the reinstalled firewall, its slot
// marked used, its timer armed and its exit watched.
func (m *Manager) adoptLive(ctx context.Context, sb Sandbox) {
	if eg, err := sb.Network.egress(); err == nil {
		if err := m.d.Net.SetEgress(ctx, sb.Slot, eg); err != nil {
			m.d.Log.Error("restore egress policy", "sandbox", sb.ID, "err", err)
		}
	}
	e := m.adopt(sb, m.acquireTemplate(sb))
	m.d.Slots.MarkUsed(sb.Slot.Index)
	if sb.State == StateRunning {
		e.mu.Lock()
		m.armTimer(e)
		e.mu.Unlock()
	}
	m.watch(e)
	m.d.Log.Info("adopted sandbox after restart", "sandbox", sb.ID, "endAt", sb.EndAt)
}

// alive says why a recorded sandbox cannot be adopted, or "" if it can.
func (m *Manager) alive(ctx context.Context, sb Sandbox) string {
	if !sb.State.Live() {
		return fmt.Sprintf("the server stopped while it was %s", sb.State)
	}
	if sb.State == StateRunning && !m.d.Clock.Now().Before(sb.EndAt) {
		return "its timeout passed while the server was down"
	}
	st, err := m.d.Runtime.State(ctx, sb.ID)
	if err != nil {
		return fmt.Sprintf("its runtime state could not be read: %v", err)
	}
	want := runtime.StatusRunning
	if sb.State.Paused() {
		want = runtime.StatusPaused
	}
	if st != want {
		return fmt.Sprintf("its container was %s after the restart, not %s", st, want)
	}
	if !m.d.Net.Exists(sb.Slot) {
		return "its network namespace was gone after the restart"
	}
	if sb.State.Paused() {
		return ""
	}
	quick, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := waitEnvd(quick, m.envd, sb); err != nil {
		return fmt.Sprintf("envd did not answer after the restart: %v", err)
	}
	return ""
}

// markLost tears a sandbox down and keeps a tombstone explaining why.
func (m *Manager) markLost(ctx context.Context, sb Sandbox, reason string) {
	m.d.Log.Warn("sandbox lost after restart; cleaning up", "sandbox", sb.ID, "reason", reason)
	if sb.Slot.Namespace != "" {
		m.d.Slots.MarkUsed(sb.Slot.Index)
	}
	sb.Reason, sb.EndCause = reason, EndLost
	// Look-ups, and the next start, say why it is gone.
	tomb := lostRecord(sb)
	m.reg.bury(tomb)
	m.rec.saveTombstone(tomb)
	m.ends.note(EndLost, sb)
	m.reap.tearDown(ctx, sb, recordUndo(sb, nil), true)
}

// lostRecord is what a tombstone keeps of a sandbox (no secrets).
func lostRecord(sb Sandbox) Sandbox {
	sb.State = StateLost
	sb.AccessToken = ""
	sb.TrafficToken = ""
	return sb
}
