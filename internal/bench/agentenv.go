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

	"agentenv/internal/client"
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
}

func newAgentenvTarget(c *client.Client, template string) *agentenvTarget {
	b := make([]byte, 6)
	rand.Read(b)
	return &agentenvTarget{c: c, template: template, run: hex.EncodeToString(b), boxes: map[string]client.Sandbox{}}
}

func (t *agentenvTarget) name() string { return TargetAgentenv }

func (t *agentenvTarget) create(ctx context.Context) (string, error) {
	sb, err := t.c.CreateSandbox(ctx, client.CreateRequest{
		TemplateID: t.template,
		// A short life, so that a sandbox this run fails to kill (the
		// server went away, say) does not outlive it by much.
		Timeout:  300,
		Metadata: map[string]string{benchLabel: t.run},
	})
	if err != nil {
		return "", err
	}
	t.mu.Lock()
	t.boxes[sb.SandboxID] = sb
	t.mu.Unlock()
	if err := t.exec(ctx, sb.SandboxID); err != nil {
		return "", errors.Join(fmt.Errorf("first command: %w", err), t.kill(context.WithoutCancel(ctx), sb.SandboxID))
	}
	return sb.SandboxID, nil
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

// close kills the sandboxes of this run that are still alive: those it
// knows of, and those the server lists under this run's label.
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
	for id := range ids {
		if err := t.killEventually(ctx, id); err != nil {
			errs = append(errs, fmt.Errorf("kill sandbox %s: %w", id, err))
		}
	}
	return errors.Join(errs...)
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
