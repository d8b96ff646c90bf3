package sandbox

import (
	"context"
	"slices"
	"sync"
)

// Spares are what the server makes ahead of demand: warm containers
// (warm.go) and pooled sandboxes (hot.go). Users neither see nor kill
// them, so although they hold their template as sandboxes do, they never
// keep it from being deleted (they go with it), and a template's "in use"
// leaves them out.

// Unlisted is how many holders of the template are not sandboxes a user
// sees: its spares (and those being made), and sandboxes killed but still
// being torn down.
func (m *Manager) Unlisted(template string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := len(m.warm[template]) + len(m.hot[template]) + m.making[template]
	for _, t := range m.dying {
		if t != nil && t.sb.Template == template {
			n++
		}
	}
	return n
}

// makeSpare runs make, which makes one spare of template and lists it,
// under mu (warmPrep or hotBoot), unless the template is being built,
// made ready or deleted (Preparing); ran says whether make ran.
func (m *Manager) makeSpare(mu *sync.Mutex, template string, make func() error) (ran bool, err error) {
	mu.Lock()
	defer mu.Unlock()
	if m.isPreparing(template) {
		return false, nil
	}
	m.mu.Lock()
	if m.making == nil {
		m.making = map[string]int{}
	}
	m.making[template]++
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		if m.making[template]--; m.making[template] <= 0 {
			delete(m.making, template)
		}
		m.mu.Unlock()
	}()
	return true, make()
}

// dropSpares removes the template's spares and keeps new ones from being
// made until done is called, and waits until what they held is released.
func (m *Manager) dropSpares(template string) (done func()) {
	done = m.Preparing(template)
	// A spare being made finishes (and is listed) first; the next ones
	// see the mark and are not made.
	m.warmPrep.Lock()
	m.warmPrep.Unlock()
	m.hotBoot.Lock()
	m.hotBoot.Unlock()
	m.dropWarmOf(template)
	m.mu.Lock()
	pooled := slices.Clone(m.hot[template])
	m.mu.Unlock()
	for _, id := range pooled {
		// Only if still pooled: a create may have just taken it.
		if e, err := m.entry(id); err == nil {
			m.killWhen(context.Background(), e, "", func(sb Sandbox) bool { return sb.State == StatePooled })
		}
	}
	m.settle(func(sb Sandbox) bool { return sb.Template == template })
	return done
}

// drainPool empties a pool of spares (per template, under m.mu) and drops
// each outside the lock.
func drainPool[T any](m *Manager, pool *map[string][]T, drop func(T)) {
	m.mu.Lock()
	all := *pool
	*pool = map[string][]T{}
	m.mu.Unlock()
	for _, list := range all {
		for _, x := range list {
			drop(x)
		}
	}
}
