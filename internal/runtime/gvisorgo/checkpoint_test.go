package gvisorgo

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/runtime"
)

// TestRestoreIntoPrepared restores a checkpoint into a sandbox made in
// advance by Prepare, and checks that Restore refuses to replace a sandbox
// that already runs.
func TestRestoreIntoPrepared(t *testing.T) {
	e := newEnv(t)
	g := e.newRuntime(t, "root")
	ctx := context.Background()
	s := e.spec(t, g)
	if err := g.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	mustExec(t, g, s.ID, "echo kept > /tmp/kept")
	img := filepath.Join(s.Dir, "ckpt")
	if err := g.Checkpoint(ctx, s.ID, img); err != nil {
		t.Fatal(err)
	}

	c := e.spec(t, g)
	if err := g.Prepare(ctx, c); err != nil {
		t.Fatal(err)
	}
	if st, err := g.State(ctx, c.ID); err != nil || st != runtime.StatusStopped {
		t.Errorf("state of a prepared sandbox = %s, %v; want stopped (created, nothing runs)", st, err)
	}
	if err := g.Restore(ctx, c, img); err != nil {
		t.Fatal(err)
	}
	if st, err := g.State(ctx, c.ID); err != nil || st != runtime.StatusRunning {
		t.Errorf("state after restore = %s, %v; want running", st, err)
	}
	if got := mustExec(t, g, c.ID, "cat /tmp/kept"); got != "kept\n" {
		t.Errorf("restored /tmp/kept = %q", got)
	}

	err := g.Restore(ctx, s, img)
	if !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("restore over a running sandbox: %v, want a conflict", err)
	}
	if st, _ := g.State(ctx, s.ID); st != runtime.StatusRunning {
		t.Errorf("a refused restore left the running sandbox %s", st)
	}
}
