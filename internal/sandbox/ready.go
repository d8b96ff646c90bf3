package sandbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/refcount"
	"github.com/agentenv/agentenv/internal/snapshot"
)

// Ready templates: a template is booted once, its envd is waited for, and
// the running sandbox is snapshotted; creating a sandbox of the template
// then restores that snapshot instead of booting. The snapshot is internal
// (not listed), named "ready:<template>", and made again when the runtime
// build or the template changes.

const readyPrefix = "ready:"

// readySnapshot returns the ready snapshot of a template, if ready
// templates are on and it was made by this runtime build with the disk size
// the template's sandboxes get now (the size is part of a restore's spec: a
// snapshot from before the disk layer, or from another --disk-mb, is made
// again).
func (m *Manager) readySnapshot(template string) (snapshot.Snapshot, bool) {
	if !m.d.ReadyTemplates || m.d.Snapshots == nil {
		return snapshot.Snapshot{}, false
	}
	disk := m.size.diskMB(template)
	for _, sn := range m.d.Snapshots.ListAll() {
		if sn.Internal && sn.Name == readyPrefix+template && sn.Runtime == m.d.Runtime.Version() && sn.DiskMB == disk {
			return sn, true
		}
	}
	return snapshot.Snapshot{}, false
}

// dropReady deletes the ready snapshots of a template (all builds).
func (m *Manager) dropReady(template string) {
	if m.d.Snapshots == nil {
		return
	}
	m.warm.DropOf(template)
	for _, sn := range m.d.Snapshots.ListAll() {
		if sn.Internal && sn.Name == readyPrefix+template {
			if err := m.d.Snapshots.Delete(sn.ID); err != nil {
				m.d.Log.Warn("delete ready snapshot", "snapshot", sn.ID, "err", err)
			}
		}
	}
}

// MakeReady boots the template once and keeps a snapshot of it, replacing
// an older one (always when force, e.g. after a rebuild; otherwise only if
// there is none for this runtime build). It is a no-op when ready templates
// are off.
func (m *Manager) MakeReady(ctx context.Context, template string, force bool) error {
	defer m.Preparing(template)()
	if !m.d.ReadyTemplates || m.d.Snapshots == nil {
		if force {
			return m.checkStart(ctx, template)
		}
		return nil
	}
	if _, ok := m.readySnapshot(template); ok && !force {
		return nil
	}
	m.dropReady(template)
	start := time.Now()
	// Boot with the template's size; a sandbox restored from it gets its
	// own limits from its create request.
	sb, err := m.newBoot(BootCreate, CreateRequest{Template: template, Timeout: time.Minute}, nil).newSandbox(ctx, createSteps)
	if err != nil {
		return fmt.Errorf("boot template %s to make it ready: %w", template, err)
	}
	defer m.Kill(context.WithoutCancel(ctx), sb.ID)
	if _, err := m.Snapshot(ctx, sb.ID, SnapshotRequest{Name: readyPrefix + template, internal: true}); err != nil {
		return fmt.Errorf("snapshot template %s: %w", template, err)
	}
	m.d.Log.Info("template ready", "template", template, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// DeleteTemplate deletes a template, its ready snapshot and its spares
// (warm containers, pooled sandboxes): only sandboxes keep it.
func (m *Manager) DeleteTemplate(name string) error {
	defer m.dropSpares(name)()
	if err := m.d.Templates.Delete(name); err != nil {
		return err
	}
	m.dropReady(name)
	return nil
}

// readyEnv is the environment a sandbox restored from a ready snapshot
// gets through envd: its own variables and identity.
func readyEnv(sb Sandbox) map[string]string {
	env := map[string]string{"E2B_SANDBOX_ID": sb.ID}
	for k, v := range sb.EnvVars {
		env[k] = v
	}
	return env
}

// IsReady reports whether creates of the template restore a ready snapshot.
func (m *Manager) IsReady(template string) bool {
	_, ok := m.readySnapshot(template)
	return ok
}

// MakeBuiltReady makes a template just built ready. A template whose start
// command fails its ready check cannot start sandboxes: it is deleted, so
// a failed build leaves nothing behind.
func (m *Manager) MakeBuiltReady(ctx context.Context, template string) error {
	err := m.MakeReady(ctx, template, true)
	t, gerr := m.d.Templates.Get(template)
	if err == nil || gerr != nil || t.StartCmd == "" {
		return err
	}
	// A create that took the template all the same (a client's, as soon
	// as the template was stored) holds it until its start command fails.
	deadline := time.Now().Add(time.Duration(max(t.ReadyTimeout, 60)+30) * time.Second)
	for {
		derr := m.DeleteTemplate(template)
		if derr == nil || errors.Is(derr, errdefs.ErrNotFound) {
			return fmt.Errorf("%w (the template was removed)", err)
		}
		if !errors.Is(derr, errdefs.ErrConflict) || time.Now().After(deadline) {
			return errors.Join(err, fmt.Errorf("remove the failed template: %w", derr))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// checkStart boots a template with a start command once, when no ready
// snapshot is kept, so that a build reports a start command that fails.
func (m *Manager) checkStart(ctx context.Context, template string) error {
	if t, err := m.d.Templates.Get(template); err != nil || t.StartCmd == "" {
		return err
	}
	sb, err := m.newBoot(BootCreate, CreateRequest{Template: template, Timeout: time.Minute}, nil).newSandbox(ctx, createSteps)
	if err != nil {
		return err
	}
	return m.Kill(context.WithoutCancel(ctx), sb.ID)
}

// Preparing marks a template as being built or made ready until done is
// called: the hot pool boots none of it meanwhile (a boot there would run
// a start command not yet known to pass, or race the ready snapshot).
func (m *Manager) Preparing(template string) (done func()) { return m.prep.mark(template) }

// preparing counts, per template, the builds and MakeReady calls at work
// on it, and deletes: the hot and warm pools leave it alone until they
// end. Its lock is its own: taken under none of the manager's, and
// nothing is called under it.
type preparing struct {
	mu   sync.Mutex
	once sync.Once
	n    *refcount.Counts[string]
}

func (p *preparing) init() { p.once.Do(func() { p.n = refcount.New[string](&p.mu, nil) }) }

// mark counts one preparation of template until done is called.
func (p *preparing) mark(template string) (done func()) {
	p.init()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n.Hold(template)
}

// has says whether template is being prepared.
func (p *preparing) has(template string) bool {
	p.init()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n.N(template) > 0
}
