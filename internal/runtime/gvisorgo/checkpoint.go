package gvisorgo

import (
	"context"
	"errors"
	"fmt"
	"os"

	"gvisor.dev/gvisor/pkg/sentry/control"
	"gvisor.dev/gvisor/pkg/state/statefile"
	"gvisor.dev/gvisor/runsc/config"
	"gvisor.dev/gvisor/runsc/container"
	"gvisor.dev/gvisor/runsc/sandbox"

	"agentenv/internal/errdefs"
	"agentenv/internal/runtime"
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
	_, _, err := g.prepare(ctx, spec)
	return err
}

// Restore implements runtime.Checkpointer: it starts a new sandbox from a
// checkpoint written by Checkpoint. The spec must describe the same image
// as the checkpointed sandbox's. If Prepare made a sandbox for spec.ID, the
// checkpoint is restored into it.
//
// Like `runsc restore`, it passes no network configuration: the sandbox
// scrapes its (new) network namespace again, so a restored sandbox uses the
// addresses of the namespace it runs in, not those of the checkpointed one.
func (g *Gvisor) Restore(ctx context.Context, spec runtime.Spec, dir string) (err error) {
	if spec.ID == "" || spec.Dir == "" || spec.Image == "" {
		return errdefs.Invalid("runtime spec needs an ID, a directory and an image")
	}
	c, conf, err := g.created(ctx, spec)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			if derr := g.Destroy(context.WithoutCancel(ctx), spec.ID); derr != nil {
				err = errors.Join(err, fmt.Errorf("clean up after failed restore: %w", derr))
			}
		}
	}()
	if err := c.Restore(conf, dir, false /* direct */, false /* background */, nil /* networkArgs: scrape the netns again */); err != nil {
		return fmt.Errorf("restore %s from %s: %w%s", spec.ID, dir, err, consoleTail(spec.Dir))
	}
	return nil
}

// created returns spec's sandbox in the Created state: the one Prepare made,
// or a new one.
func (g *Gvisor) created(ctx context.Context, spec runtime.Spec) (*container.Container, *config.Config, error) {
	c, err := g.load(spec.ID, false)
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		return g.prepare(ctx, spec)
	case err != nil:
		return nil, nil, err
	case c.Status != container.Created:
		return nil, nil, errdefs.Conflict("sandbox %s exists and is %s", spec.ID, c.Status)
	}
	conf, err := g.conf(network(spec))
	if err != nil {
		return nil, nil, err
	}
	return c, conf, nil
}
