package gvisor

import (
	"context"
	"fmt"
	"os"

	"github.com/agentenv/agentenv/internal/runtime"
)

var _ runtime.Checkpointer = (*Gvisor)(nil)

// Checkpoint implements runtime.Checkpointer: it writes the sandbox's
// memory, processes and memory-overlay filesystem to dir and leaves the
// sandbox running.
func (g *Gvisor) Checkpoint(ctx context.Context, id, dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if _, err := g.run(ctx, "checkpoint", "--leave-running", "--image-path", dir, id); err != nil {
		return fmt.Errorf("checkpoint %s: %w", id, err)
	}
	return nil
}

// Restore implements runtime.Checkpointer: it starts a new sandbox from a
// checkpoint written by Checkpoint. The spec must describe the same image
// as the checkpointed sandbox's. Memory pages load in the background, as
// with the in-process runtime.
func (g *Gvisor) Restore(ctx context.Context, spec runtime.Spec, dir string) error {
	return g.start(ctx, spec, "restore", "--detach", "--background", "--image-path", dir)
}
