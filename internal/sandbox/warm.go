package sandbox

import (
	"context"
	"os"
	"path/filepath"

	"github.com/agentenv/agentenv/internal/netns"
	"github.com/agentenv/agentenv/internal/runtime"
)

// Warm containers: sandboxes created in advance (runtime.Preparer) with the
// template's size (its CPUs and memory, else the defaults), each in its own network slot, waiting for a restore. Any
// restore whose snapshot has that template and those limits — a create of a
// ready template, a create from a user snapshot, a fork child — restores
// into one and skips the sandbox process's start-up (about half of a
// restore's CPU).
//
// They are kept for ready templates (WarmPool each) and for templates
// restored from in the last pool.Linger (as many as the largest fork of the
// template asked for, at least WarmPool). Refills wait until no warm
// container has been taken for pool.Quiet, so that they do not compete with
// the burst of restores (a fork) they are meant to speed up.
//
// They are not sandboxes: they have no record, only a marker file in their
// directory, and a restart removes them.

const warmMarker = "warm"

type warmEntry struct {
	id       string
	template string
	slot     netns.Slot
	cpus     int
	memMB    int
	pids     int64
	diskMB   int
	// undo gives back what the container holds (its template, directory,
	// slot and container); a restore into it takes it over.
	undo undo
}

// takeWarm returns a warm container of the template with those limits, if
// there is one. It is a sandbox's from then on: its directory loses the
// marker (Recover would remove it as a warm container of the last run).
func (m *Manager) takeWarm(template string, cpus, memMB int, pids int64, diskMB int) *warmEntry {
	defer m.warm.Wake()
	for {
		// The disk size is in the spec's annotations, which a restore
		// must match.
		w, ok := m.warm.Pop(template, func(w warmEntry) bool {
			return w.cpus == cpus && w.memMB == memMB && w.pids == pids && w.diskMB == diskMB
		})
		if !ok {
			return nil
		}
		err := os.Remove(filepath.Join(m.rec.dir(w.id), warmMarker))
		if err == nil {
			return &w
		}
		m.d.Log.Warn("warm container unusable; removing it", "container", w.id, "err", err)
		m.dropWarm(context.Background(), w)
	}
}

// wantWarm records that n restores of a snapshot of template with those
// limits happen at once (a fork of n, or 1 for a create from a snapshot):
// if warm containers fit them (the template's size), the template's are kept
// at that number for pool.Linger.
func (m *Manager) wantWarm(template string, cpus, memMB int, nproc int64, diskMB, n int) {
	l := m.d.Limits
	if m.d.WarmPool <= 0 {
		return
	}
	if wc, wm := m.size.of(template); cpus != wc || memMB != wm || l.pids(nproc) != l.pids(l.nproc(wm)) || diskMB != m.size.diskMB(template) {
		return
	}
	m.warm.Want(template, n)
}

// RunWarm keeps the warm containers of each template at their target until
// ctx ends, then removes them.
func (m *Manager) RunWarm(ctx context.Context) { m.warm.Run(ctx) }

// warmSteps prepare a warm container: a box with the template's size, its
// own slot and the default egress policy, created but not started.
var warmSteps = []step{tmplStep, slotStep, {"marker", (*boot).warmMarker, false},
	{"prepare", (*boot).prepare, true}, {"readdress", (*boot).readdress, false}, egStep, {"listed", (*boot).listWarm, false}}

func (m *Manager) prepareWarm(ctx context.Context, prep runtime.Preparer, template string) error {
	l := m.d.Limits
	b := m.newBoot(BootWarm, CreateRequest{}, nil)
	cpus, memMB := m.size.of(template)
	b.sb = Sandbox{ID: newID(), Template: template, CPUs: cpus, MemoryMB: memMB, Nproc: l.nproc(memMB), DiskMB: m.size.diskMB(template)}
	b.making = &warmEntry{id: b.sb.ID, template: template, cpus: b.sb.CPUs, memMB: b.sb.MemoryMB, pids: l.pids(b.sb.Nproc), diskMB: b.sb.DiskMB, undo: undo{id: b.sb.ID}}
	b.u = &b.making.undo
	// The default egress policy now, so that a restore that wants it
	// skips that step (Slots.Put removes it with the slot).
	eg, err := (&Network{AllowInternet: true}).egress()
	if err != nil {
		return err
	}
	b.egress = eg
	b.prep = prep
	return b.run(ctx, warmSteps)
}

// warmMarker makes the container's directory, marked as a warm
// container's (Recover removes it as one).
func (b *boot) warmMarker(ctx context.Context) error {
	dir := b.m.rec.dir(b.sb.ID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, warmMarker), nil, 0o600)
}

// prepare creates the container without starting it.
func (b *boot) prepare(ctx context.Context) error {
	b.container = true
	return b.prep.Prepare(ctx, b.m.spec(b.sb, b.image))
}

// readdress gives the slot's interface its addresses back: creating the
// container took them, and the restore looks at the namespace again.
func (b *boot) readdress(ctx context.Context) error { return b.m.d.Net.Readdress(ctx, b.sb.Slot) }

func (b *boot) listWarm(ctx context.Context) error {
	w := b.making
	w.slot = b.sb.Slot
	b.m.warm.Add(b.sb.Template, *w)
	return nil
}

// dropWarm removes one warm container and what it holds.
func (m *Manager) dropWarm(ctx context.Context, w warmEntry) {
	m.reap.tearDown(ctx, Sandbox{ID: w.id, Template: w.template}, w.undo, true)
}
