package sandbox

import (
	"context"
	"sync"
)

// BuildNetwork gives one build sandbox (internal/imagebuild, which runs
// runsc itself) a network slot from the pool, with the default egress
// policy of a sandbox: the internet, but not the host, this server's
// other sandboxes or private networks. The slot is activated once the
// sandbox has taken its eth0 over; release (idempotent) stops waiting for
// that and gives the slot back. One call per sandbox: a slot serves one.
func (m *Manager) BuildNetwork(ctx context.Context) (netnsPath string, release func(), err error) {
	slot, err := m.d.Slots.Get(ctx)
	if err != nil {
		return "", nil, busy("set up a build sandbox's network", err)
	}
	eg, err := Network{AllowInternet: true}.egress()
	if err == nil {
		err = m.d.Net.SetEgress(ctx, slot, eg)
	}
	if err != nil {
		m.d.Slots.Put(context.WithoutCancel(ctx), slot)
		return "", nil, busy("apply a build sandbox's egress policy", err)
	}
	wait, stop := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := m.d.Net.ActivateWhenTaken(wait, slot); err != nil && wait.Err() == nil {
			m.d.Log.Warn("build sandbox network not activated", "slot", slot.Index, "err", err)
		}
	}()
	var once sync.Once
	return slot.Path(), func() {
		once.Do(func() {
			stop()
			<-done
			if err := m.d.Slots.Put(context.Background(), slot); err != nil {
				m.d.Log.Warn("give back a build sandbox's network slot", "slot", slot.Index, "err", err)
			}
		})
	}, nil
}

// Rebuilding removes a template's spares (warm containers, hot pool
// sandboxes) and keeps new ones from being made until done is called, so
// that a rebuild is refused only for sandboxes a user holds: spares hold
// the template's files as a user's sandbox does.
func (m *Manager) Rebuilding(template string) (done func()) { return m.dropSpares(template) }
