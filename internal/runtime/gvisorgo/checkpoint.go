package gvisorgo

import (
	"context"
	"fmt"
	"os"

	"gvisor.dev/gvisor/pkg/sentry/control"
	"gvisor.dev/gvisor/pkg/state/statefile"
	"gvisor.dev/gvisor/runsc/sandbox"

	"github.com/agentenv/agentenv/internal/runtime"
)

// Checkpoint implements runtime.Checkpointer: it writes the sandbox's
// memory, processes and memory-overlay filesystem to dir and leaves the
// sandbox running (`runsc checkpoint --leave-running`, same defaults).
func (g *Gvisor) Checkpoint(ctx context.Context, id, dir string) error {
	c, err := g.load(id, false)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	conf := g.opConf
	opts := sandbox.CheckpointOpts{
		Compression:                statefile.CompressionLevelDefault,
		Resume:                     true,
		SaveRestoreExecTimeout:     control.DefaultSaveRestoreExecTimeout,
		SaveRestoreExecContainerID: c.ID,
	}
	if err := c.Checkpoint(conf, dir, opts); err != nil {
		return fmt.Errorf("checkpoint %s: %w", id, err)
	}
	return nil
}

// Prepare creates the sandbox process for spec without starting anything in
// it, as `runsc create` does. A later Restore with the same spec restores
// into it and skips the sandbox start-up (about half of a restore's time),
// so callers can keep a pool of prepared sandboxes. Destroy removes a
// prepared sandbox; State reports it as stopped until it is restored.
func (g *Gvisor) Prepare(ctx context.Context, spec runtime.Spec) error {
	return g.call(ctx, request{Op: opPrepare, Spec: spec})
}

// Restore implements runtime.Checkpointer: it starts a new sandbox from a
// checkpoint written by Checkpoint. The spec must describe the same image
// as the checkpointed sandbox's. If Prepare made a sandbox for spec.ID, the
// checkpoint is restored into it.
//
// Like `runsc restore`, it passes no network configuration: the sandbox
// scrapes its (new) network namespace again, so a restored sandbox uses the
// addresses of the namespace it runs in, not those of the checkpointed one.
func (g *Gvisor) Restore(ctx context.Context, spec runtime.Spec, dir string) error {
	return g.call(ctx, request{Op: opRestore, Spec: spec, Image: dir})
}
