package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/agentenv/agentenv/internal/netns"
	"github.com/agentenv/agentenv/internal/runtime"
)

// Warm containers: sandboxes created in advance (runtime.Preparer) with the
// default limits, each in its own network slot, waiting for a restore. Any
// restore whose snapshot has that template and those limits — a create of a
// ready template, a create from a user snapshot, a fork child — restores
// into one and skips the sandbox process's start-up (about half of a
// restore's CPU).
//
// They are kept for ready templates (WarmPool each) and for templates
// restored from in the last warmLinger (as many as the largest fork of the
// template asked for, at least WarmPool). Refills wait until no warm
// container has been taken for warmQuiet, so that they do not compete with
// the burst of restores (a fork) they are meant to speed up.
//
// They are not sandboxes: they have no record, only a marker file in their
// directory, and a restart removes them.

const (
	warmMarker = "warm"
	// warmLinger is how long a template stays warm after its last restore.
	warmLinger = 10 * time.Minute
	// warmQuiet is how long refills wait after a warm container was taken:
	// long enough for the restores of a fork to reach the runtime, whose
	// workers then serve them before any refill (see gvisorgo's dispatch).
	warmQuiet = 100 * time.Millisecond
)

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

// warmPool holds the warm containers and the demand for them, under its
// own lock (spares: a leaf, after Manager.mu).
type warmPool struct {
	spares[warmEntry]
	// demand holds, per template restored from lately, how many warm
	// containers it wants and until when.
	demand   map[string]warmDemand
	lastTake time.Time
	// ready says whether the template has a ready snapshot
	// (Manager.IsReady): those keep WarmPool warm containers.
	ready func(template string) bool
}

// pop takes a warm container of the template with those limits, if
// there is one.
func (p *warmPool) pop(template string, cpus, memMB int, pids int64, diskMB int) *warmEntry {
	p.mu.Lock()
	defer p.mu.Unlock()
	list := p.lists[template]
	for i, w := range list {
		// The disk size is in the spec's annotations, which a restore
		// must match.
		if w.cpus == cpus && w.memMB == memMB && w.pids == pids && w.diskMB == diskMB {
			p.lastTake = time.Now()
			p.lists[template] = append(list[:i:i], list[i+1:]...)
			return &w
		}
	}
	return nil
}

// want keeps the template's warm containers at n or more (floor at
// least) for warmLinger.
func (p *warmPool) want(template string, n, floor int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.demand == nil {
		p.demand = map[string]warmDemand{}
	}
	d := p.demand[template]
	if time.Now().After(d.until) {
		d.n = 0
	}
	d.n = max(d.n, n, floor)
	d.until = time.Now().Add(warmLinger)
	p.demand[template] = d
}

// target is how many warm containers the template should have now
// (floor if it is ready). Callers hold p.mu.
func (p *warmPool) target(template string, ready bool, floor int) int {
	n := 0
	if ready {
		n = floor
	}
	if d, ok := p.demand[template]; ok {
		if time.Now().Before(d.until) {
			n = max(n, d.n)
		} else {
			delete(p.demand, template)
		}
	}
	return n
}

// trim cuts the template's warm containers to its target and returns
// those cut (to be dropped), whether it is short of the target, and how
// long refills should still wait after the last take.
func (p *warmPool) trim(template string, ready bool, floor int) (extra []warmEntry, short bool, quiet time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	have, want := len(p.lists[template]), p.target(template, ready, floor)
	if have > want {
		extra = p.lists[template][want:]
		p.lists[template] = p.lists[template][:want:want]
	}
	return extra, have < want, warmQuiet - time.Since(p.lastTake)
}

// forget removes the template's warm containers and demand and returns
// the containers, to be dropped.
func (p *warmPool) forget(template string) []warmEntry {
	p.mu.Lock()
	defer p.mu.Unlock()
	list := p.lists[template]
	delete(p.lists, template)
	delete(p.demand, template)
	return list
}

type warmDemand struct {
	n     int
	until time.Time
}

// takeWarm returns a warm container of the template with those limits, if
// there is one. It is a sandbox's from then on: its directory loses the
// marker (Recover would remove it as a warm container of the last run).
func (m *Manager) takeWarm(template string, cpus, memMB int, pids int64, diskMB int) *warmEntry {
	defer m.warm.wake()
	for {
		w := m.warm.pop(template, cpus, memMB, pids, diskMB)
		if w == nil {
			return nil
		}
		err := os.Remove(filepath.Join(m.dir(w.id), warmMarker))
		if err == nil {
			return w
		}
		m.d.Log.Warn("warm container unusable; removing it", "container", w.id, "err", err)
		m.dropWarm(context.Background(), *w)
	}
}

// wantWarm records that n restores of a snapshot of template with those
// limits happen at once (a fork of n, or 1 for a create from a snapshot):
// if warm containers fit them (the default limits), the template's are kept
// at that number for warmLinger.
func (m *Manager) wantWarm(template string, cpus, memMB int, nproc int64, diskMB, n int) {
	l := m.d.Limits
	if m.d.WarmPool <= 0 || cpus != l.DefaultCPUs || memMB != l.DefaultMemMB || l.pids(nproc) != l.pids(l.nproc(l.DefaultMemMB)) || diskMB != m.diskMB(template) {
		return
	}
	m.warm.want(template, n, m.d.WarmPool)
}

// kick wakes a refill loop without blocking (one pending wake-up is enough).
func kick(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// RunWarm keeps the warm containers of each template at their target until
// ctx ends, then removes them.
func (m *Manager) RunWarm(ctx context.Context) { m.warm.loop(ctx, m.warm.refill) }

// refill brings each template's warm containers to its target, one at a
// time, and drops those of templates no longer wanted or gone.
func (p *warmPool) refill(ctx context.Context) {
	h := p.host
	templates := h.templates()
	for _, name := range p.templates() {
		if !slices.Contains(templates, name) {
			p.dropOf(name)
		}
	}
	for _, t := range templates {
		ready := p.ready(t)
		for ctx.Err() == nil {
			extra, short, quiet := p.trim(t, ready, h.size)
			for _, w := range extra {
				h.drop(context.WithoutCancel(ctx), w)
			}
			if !short {
				break
			}
			if quiet > 0 {
				// A burst of restores is taking warm containers: let it
				// finish first.
				select {
				case <-ctx.Done():
				case <-time.After(quiet):
				}
				continue
			}
			ran, err := p.makeOne(t, func() error { return h.make(ctx, t) })
			if err != nil {
				h.log.Warn("prepare a warm container", "template", t, "err", err)
			}
			if !ran || err != nil {
				break
			}
		}
	}
}

// warmSteps prepare a warm container: a box with the default limits, its
// own slot and the default egress policy, created but not started.
var warmSteps = []step{tmplStep, slotStep, {"marker", (*boot).warmMarker, false},
	{"prepare", (*boot).prepare, true}, {"readdress", (*boot).readdress, false}, egStep, {"listed", (*boot).listWarm, false}}

func (m *Manager) prepareWarm(ctx context.Context, prep runtime.Preparer, template string) error {
	l := m.d.Limits
	b := m.newBoot(BootWarm, CreateRequest{}, nil)
	b.sb = Sandbox{ID: newID(), Template: template, CPUs: l.DefaultCPUs, MemoryMB: l.DefaultMemMB, Nproc: l.nproc(l.DefaultMemMB), DiskMB: m.diskMB(template)}
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
	return m.runBoot(ctx, b, warmSteps)
}

// warmMarker makes the container's directory, marked as a warm
// container's (Recover removes it as one).
func (b *boot) warmMarker(ctx context.Context) error {
	dir := b.m.dir(b.sb.ID)
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
	b.m.warm.add(b.sb.Template, *w)
	return nil
}

// dropWarm removes one warm container and what it holds.
func (m *Manager) dropWarm(ctx context.Context, w warmEntry) {
	m.tearDown(ctx, Sandbox{ID: w.id, Template: w.template}, w.undo, true)
}

// dropOf removes the warm containers of a template (it was deleted or
// rebuilt) and forgets its demand.
func (p *warmPool) dropOf(template string) {
	for _, w := range p.forget(template) {
		p.host.drop(context.Background(), w)
	}
}
