package gvisor

import (
	"agentenv/internal/childproc"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"agentenv/internal/errdefs"
	"agentenv/internal/runtime"
	"agentenv/internal/runtime/ocispec"
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
// as the checkpointed sandbox's.
func (g *Gvisor) Restore(ctx context.Context, spec runtime.Spec, dir string) (err error) {
	if spec.ID == "" || spec.Dir == "" || spec.Image == "" {
		return errdefs.Invalid("runtime spec needs an ID, a directory and an image")
	}
	defer func() {
		if err != nil {
			if derr := g.Destroy(context.WithoutCancel(ctx), spec.ID); derr != nil {
				err = errors.Join(err, fmt.Errorf("clean up after failed restore: %w", derr))
			}
		}
	}()
	bundle, err := ocispec.WriteBundle(spec, g.cgroupsPathFor(spec.ID))
	if err != nil {
		return fmt.Errorf("write bundle: %w", err)
	}
	network := "sandbox"
	if spec.NetNS == "" {
		network = "none"
	}
	logPath := filepath.Join(spec.Dir, "console.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	args := append(g.globalArgs(network), "restore", "--detach", "--bundle", bundle, "--image-path", dir, spec.ID)
	cmd := exec.CommandContext(ctx, g.runsc, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := childproc.Run(cmd); err != nil {
		return fmt.Errorf("runsc restore %s: %w: %s", spec.ID, err, tail(logPath))
	}
	return nil
}
