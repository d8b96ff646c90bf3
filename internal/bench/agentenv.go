package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/agentenv/agentenv/client"
)

// benchLabel is the metadata key that marks the sandboxes of one bench run,
// so that close can find sandboxes whose create was interrupted before the
// server answered with their ID.
const benchLabel = "agentenv-bench"

// agentenvTarget does the work through the agentenv API and envd.
type agentenvTarget struct {
	c        *client.Client
	template string
	run      string

	mu    sync.Mutex
	boxes map[string]client.Sandbox
	snaps map[string]bool // snapshots this run made and has not deleted
	boots bootRecorder
}

func newAgentenvTarget(c *client.Client, template string) *agentenvTarget {
	b := make([]byte, 6)
	rand.Read(b)
	return &agentenvTarget{c: c, template: template, run: hex.EncodeToString(b), boxes: map[string]client.Sandbox{}, snaps: map[string]bool{}}
}

func (t *agentenvTarget) name() string { return TargetAgentenv }

func (t *agentenvTarget) create(ctx context.Context) (string, error) {
	return t.start(ctx, client.CreateRequest{TemplateID: t.template})
}

// densityLifetime is the timeout, in seconds, of the density group's
// sandboxes: a thousand creates a few at a time take minutes, and the first
// must still be up when the last has started.
const densityLifetime = 1800

// createIdle creates a sandbox that outlives the density group's creates.
func (t *agentenvTarget) createIdle(ctx context.Context) (string, error) {
	return t.start(ctx, client.CreateRequest{TemplateID: t.template, Timeout: new(int64(densityLifetime))})
}

// start creates a sandbox (booted from a template, or restored when
// req.TemplateID names a snapshot) and returns once /bin/true has run in it.
func (t *agentenvTarget) start(ctx context.Context, req client.CreateRequest) (string, error) {
	if req.Timeout == nil {
		// A short life, so that a sandbox this run fails to kill (the
		// server went away, say) does not outlive it by much.
		req.Timeout = new(int64(300))
	}
	req.Metadata = map[string]string{benchLabel: t.run}
	sb, err := t.c.CreateSandbox(ctx, req)
	if err != nil {
		return "", err
	}
	t.remember(sb)
	if err := t.exec(ctx, sb.SandboxID); err != nil {
		return "", errors.Join(fmt.Errorf("first command: %w", err), t.kill(context.WithoutCancel(ctx), sb.SandboxID))
	}
	return sb.SandboxID, nil
}

func (t *agentenvTarget) remember(sb client.Sandbox) {
	t.mu.Lock()
	t.boxes[sb.SandboxID] = sb
	t.boots.add(sb.Boot)
	t.mu.Unlock()
}

func (t *agentenvTarget) sandbox(id string) client.Sandbox {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.boxes[id]
}

func (t *agentenvTarget) exec(ctx context.Context, id string) error {
	res, err := t.c.Exec(ctx, t.sandbox(id), "/bin/true", nil, nil, nil)
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("/bin/true exited with %d: %s", res.ExitCode, bytes.TrimSpace(res.Stderr))
	}
	return nil
}

func (t *agentenvTarget) writeRead(ctx context.Context, id string, data []byte) error {
	sb := t.sandbox(id)
	const path = "/tmp/agentenv-bench"
	if err := t.c.WriteFile(ctx, sb, path, bytes.NewReader(data)); err != nil {
		return err
	}
	got, err := t.c.ReadFile(ctx, sb, path)
	if err != nil {
		return err
	}
	return checkPayload(got, data)
}

func (t *agentenvTarget) kill(ctx context.Context, id string) error {
	if err := t.c.KillSandbox(ctx, id); err != nil {
		return err
	}
	t.mu.Lock()
	delete(t.boxes, id)
	t.mu.Unlock()
	return nil
}

// close kills the sandboxes of this run that are still alive (those it
// knows of, and those the server lists under this run's label), then
// deletes the snapshots the run made: a snapshot cannot go while a sandbox
// restored from it runs.
func (t *agentenvTarget) close(ctx context.Context) error {
	ids := map[string]bool{}
	t.mu.Lock()
	for id := range t.boxes {
		ids[id] = true
	}
	t.mu.Unlock()
	var errs []error
	listed, err := t.c.ListSandboxes(ctx, map[string]string{benchLabel: t.run})
	if err != nil {
		errs = append(errs, fmt.Errorf("list this run's sandboxes: %w", err))
	}
	for _, sb := range listed {
		ids[sb.SandboxID] = true
	}
	// Eight at a time: after an interrupted density run there may be a
	// thousand.
	var all []string
	for id := range ids {
		all = append(all, id)
	}
	if err := forEach(ctx, all, 8, t.release); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(append(errs, t.closeSnapshots(ctx))...)
}

// closeSnapshots deletes the snapshots this run made: those it knows of and
// those the server lists with this run's label (a snapshot request cut
// short by Ctrl-C may have completed on the server).
func (t *agentenvTarget) closeSnapshots(ctx context.Context) error {
	ids := map[string]bool{}
	t.mu.Lock()
	for id := range t.snaps {
		ids[id] = true
	}
	t.mu.Unlock()
	var errs []error
	listed, err := t.c.ListSnapshots(ctx, "")
	if err != nil {
		errs = append(errs, fmt.Errorf("list snapshots: %w", err))
	}
	for _, sn := range listed {
		if sn.Metadata[benchLabel] == t.run {
			ids[sn.SnapshotID] = true
		}
	}
	for id := range ids {
		if err := t.dropSnapshot(ctx, id); err != nil {
			errs = append(errs, fmt.Errorf("delete snapshot %s: %w", id, err))
		}
	}
	return errors.Join(errs...)
}

// release kills a sandbox, waiting out a create in flight; one already gone
// is fine.
func (t *agentenvTarget) release(ctx context.Context, id string) error {
	if err := t.killEventually(ctx, id); err != nil {
		return fmt.Errorf("kill sandbox %s: %w", id, err)
	}
	return nil
}

// killEventually kills a sandbox, waiting out a create still in flight (the
// server answers 409 until it finishes). A sandbox already gone is fine.
func (t *agentenvTarget) killEventually(ctx context.Context, id string) error {
	for {
		err := t.kill(ctx, id)
		var ce *client.Error
		switch {
		case err == nil:
			return nil
		case errors.As(err, &ce) && ce.Status == http.StatusNotFound:
			t.mu.Lock()
			delete(t.boxes, id)
			t.mu.Unlock()
			return nil
		case errors.As(err, &ce) && ce.Status == http.StatusConflict:
			select {
			case <-ctx.Done():
				return fmt.Errorf("%w (gave up waiting: %w)", err, ctx.Err())
			case <-time.After(100 * time.Millisecond):
			}
		default:
			return err
		}
	}
}

// boot creates a sandbox from the template with memMB of memory (0: the
// server's default) and returns once /bin/true has run in it.
func (t *agentenvTarget) boot(ctx context.Context, memMB int) (string, error) {
	return t.start(ctx, client.CreateRequest{TemplateID: t.template, MemoryMB: memMB})
}

func (t *agentenvTarget) sh(ctx context.Context, id, script string) error {
	res, err := t.c.Exec(ctx, t.sandbox(id), "/bin/sh", []string{"-c", script}, nil, nil)
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("sh -c %q exited with %d: %s", script, res.ExitCode, bytes.TrimSpace(res.Stderr))
	}
	return nil
}

func (t *agentenvTarget) pause(ctx context.Context, id string) error {
	return t.c.PauseSandbox(ctx, id)
}

func (t *agentenvTarget) resume(ctx context.Context, id string) error {
	_, err := t.c.ResumeSandbox(ctx, id)
	return err
}

func (t *agentenvTarget) snapshot(ctx context.Context, id string) (string, error) {
	sn, err := t.c.SnapshotSandbox(ctx, id, "", map[string]string{benchLabel: t.run})
	if err != nil {
		return "", err
	}
	t.mu.Lock()
	t.snaps[sn.SnapshotID] = true
	t.mu.Unlock()
	return sn.SnapshotID, nil
}

// dropSnapshot deletes a snapshot; one already gone is fine.
func (t *agentenvTarget) dropSnapshot(ctx context.Context, snap string) error {
	err := t.c.DeleteSnapshot(ctx, snap)
	var ce *client.Error
	if err != nil && !(errors.As(err, &ce) && ce.Status == http.StatusNotFound) {
		return err
	}
	t.mu.Lock()
	delete(t.snaps, snap)
	t.mu.Unlock()
	return nil
}

// restore creates a sandbox from a snapshot ID, as E2B does with a
// snapshot ID in place of a template.
func (t *agentenvTarget) restore(ctx context.Context, snap string) (string, error) {
	return t.start(ctx, client.CreateRequest{TemplateID: snap})
}

// fork forks id into n children and runs /bin/true in every child at once.
func (t *agentenvTarget) fork(ctx context.Context, id string, n int) ([]string, error) {
	sbs, errs, err := t.c.ForkSandbox(ctx, id, n)
	if err != nil {
		return nil, err
	}
	var kids []string
	for _, sb := range sbs {
		if sb.SandboxID != "" {
			t.remember(sb)
			kids = append(kids, sb.SandboxID)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return kids, fmt.Errorf("%d of %d children failed: %w", n-len(kids), n, err)
	}
	if len(kids) != n {
		return kids, fmt.Errorf("asked for %d children, got %d", n, len(kids))
	}
	return kids, forEach(ctx, kids, n, t.exec)
}

// pids returns the host processes of a sandbox: runsc's sandbox (and gofer)
// processes name the sandbox ID on their command line.
func (t *agentenvTarget) pids(ctx context.Context, id string) ([]int, error) {
	procs, err := readProcs()
	if err != nil {
		return nil, err
	}
	return t.pidsIn(ctx, procs, id)
}

// pidsIn is pids with the host's processes read already.
func (t *agentenvTarget) pidsIn(_ context.Context, procs map[int]proc, id string) ([]int, error) {
	roots := runscProcsOf(procs, id)
	if len(roots) == 0 {
		return nil, fmt.Errorf("no runsc process names sandbox %s on its command line", id)
	}
	return descendants(procs, roots), nil
}
