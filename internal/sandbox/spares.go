package sandbox

import "context"

// Spares are what the server makes ahead of demand: warm containers
// (warm.go) and pooled sandboxes (hot.go), kept in their pools (package
// spare, each with its own lock, taken after m.mu and before the
// registry's). Users neither see nor kill them, so although they hold their template as sandboxes do, they
// never keep it from being deleted (they go with it), and a template's
// "in use" leaves them out.

// Unlisted is how many holders of the template are not sandboxes a user
// sees: its spares (and those being made), and sandboxes killed but still
// being torn down.
func (m *Manager) Unlisted(template string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := m.warm.Held(template) + m.hot.Held(template)
	for _, t := range m.reg.tearing() {
		if t.sb.Template == template {
			n++
		}
	}
	return n
}

// dropSpares removes the template's spares and keeps new ones from being
// made until done is called, and waits until what they held is released.
func (m *Manager) dropSpares(template string) (done func()) {
	done = m.Preparing(template)
	// A spare being made finishes (and is listed) first; the next ones
	// see the mark and are not made.
	m.warm.Settle()
	m.hot.Settle()
	m.warm.DropOf(template)
	for _, id := range m.hot.Of(template) {
		// Only if still pooled: a create may have just taken it.
		if e, err := m.reg.lookup(id); err == nil {
			m.killWhen(context.Background(), e, death{}, func(sb Sandbox) bool { return sb.State == StatePooled })
		}
	}
	m.reap.settle(func(sb Sandbox) bool { return sb.Template == template })
	return done
}
