package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"time"

	"agentenv/internal/netns"
	"agentenv/internal/runtime"
)

// Warm sandboxes: for each ready template, a few containers are created in
// advance (runtime.Preparer), each in its own network slot, waiting for a
// restore. A create of a ready template then restores its snapshot into
// one of them instead of starting a sandbox process. They are not
// sandboxes: they have no record, only a marker file in their directory,
// and a restart removes them.

const warmMarker = "warm"

type warmEntry struct {
	id      string
	slot    netns.Slot
	cpus    int
	memMB   int
	release func()
}

// takeWarm returns a warm container of the template with those limits.
func (m *Manager) takeWarm(template string, cpus, memMB int) *warmEntry {
	m.mu.Lock()
	defer m.mu.Unlock()
	list := m.warm[template]
	for i, w := range list {
		if w.cpus == cpus && w.memMB == memMB {
			m.warm[template] = append(list[:i:i], list[i+1:]...)
			m.kickWarm()
			return &w
		}
	}
	m.kickWarm()
	return nil
}

func (m *Manager) kickWarm() { kick(m.warmKick) }

// kick wakes a refill loop without blocking (one pending wake-up is enough).
func kick(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// RunWarm keeps WarmPool containers ready for each ready template until
// ctx ends, then removes them.
func (m *Manager) RunWarm(ctx context.Context) {
	defer m.drainWarm()
	prep, ok := m.d.Runtime.(runtime.Preparer)
	if !ok || m.d.WarmPool <= 0 || !m.d.ReadyTemplates {
		<-ctx.Done()
		return
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		for _, t := range m.d.Templates.List() {
			if !m.IsReady(t.Name) {
				continue
			}
			for ctx.Err() == nil {
				m.mu.Lock()
				n := len(m.warm[t.Name])
				m.mu.Unlock()
				if n >= m.d.WarmPool {
					break
				}
				if err := m.prepareWarm(ctx, prep, t.Name); err != nil {
					m.d.Log.Warn("prepare a warm container", "template", t.Name, "err", err)
					break
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-m.warmKick:
		case <-tick.C:
		}
	}
}

func (m *Manager) prepareWarm(ctx context.Context, prep runtime.Preparer, template string) (err error) {
	var cl cleanup
	defer func() {
		if err != nil {
			cl.run(ctx)
		}
	}()
	image, release, err := m.d.Templates.Acquire(template)
	if err != nil {
		return err
	}
	cl.add(func(context.Context) error { release(); return nil })
	slot, err := m.d.Slots.Get(ctx)
	if err != nil {
		return err
	}
	cl.add(func(ctx context.Context) error { return m.d.Slots.Put(ctx, slot) })
	id := newID()
	dir := m.dir(id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	cl.add(func(context.Context) error { return os.RemoveAll(dir) })
	if err := os.WriteFile(filepath.Join(dir, warmMarker), nil, 0o600); err != nil {
		return err
	}
	l := m.d.Limits
	sb := Sandbox{ID: id, Template: template, Slot: slot, CPUs: l.DefaultCPUs, MemoryMB: l.DefaultMemMB, Nproc: l.nproc(l.DefaultMemMB)}
	cl.add(func(ctx context.Context) error { return m.d.Runtime.Destroy(ctx, id) })
	if err := prep.Prepare(ctx, m.spec(sb, image)); err != nil {
		return err
	}
	// Creating the container took the interface's addresses; the restore
	// looks at the namespace again and needs them back.
	if err := m.d.Net.Readdress(ctx, slot); err != nil {
		return err
	}
	m.mu.Lock()
	m.warm[template] = append(m.warm[template], warmEntry{id: id, slot: slot, cpus: sb.CPUs, memMB: sb.MemoryMB, release: release})
	m.mu.Unlock()
	return nil
}

// dropWarm removes one warm container and what it holds.
func (m *Manager) dropWarm(ctx context.Context, w warmEntry) {
	if err := m.d.Runtime.Destroy(ctx, w.id); err != nil {
		m.d.Log.Warn("remove warm container", "container", w.id, "err", err)
	}
	if err := m.d.Slots.Put(ctx, w.slot); err != nil {
		m.d.Log.Warn("release warm container's slot", "container", w.id, "err", err)
	}
	os.RemoveAll(m.dir(w.id))
	w.release()
}

func (m *Manager) drainWarm() {
	m.mu.Lock()
	all := m.warm
	m.warm = map[string][]warmEntry{}
	m.mu.Unlock()
	for _, list := range all {
		for _, w := range list {
			m.dropWarm(context.Background(), w)
		}
	}
}

// dropWarmOf removes the warm containers of a template (it was deleted or
// rebuilt).
func (m *Manager) dropWarmOf(template string) {
	m.mu.Lock()
	list := m.warm[template]
	delete(m.warm, template)
	m.mu.Unlock()
	for _, w := range list {
		m.dropWarm(context.Background(), w)
	}
}
