package gvisorgo

import (
	"agentenv/internal/runtime/pidfd"
	"context"
	"fmt"

	"agentenv/internal/errdefs"
)

// Exited implements runtime.Watcher.
func (g *Gvisor) Exited(ctx context.Context, id string) (<-chan struct{}, error) {
	if ch := g.child(id); ch != nil && ch.done != nil {
		if ch.exited() {
			return nil, fmt.Errorf("sandbox %s is not running: %w", id, errdefs.ErrConflict)
		}
		return ch.done, nil
	}
	// A sandbox made by the CLI or by an earlier agentenv process: its
	// process is not our child, so watch it without reaping.
	c, err := g.load(id, false)
	if err != nil {
		return nil, err
	}
	pid := c.SandboxPid()
	if pid <= 0 {
		return nil, fmt.Errorf("sandbox %s has no process (status %s): %w", id, c.Status, errdefs.ErrConflict)
	}
	done, err := pidfd.Watch(pid, false)
	if err != nil {
		return nil, fmt.Errorf("watch sandbox %s: %w", id, err)
	}
	return done, nil
}
