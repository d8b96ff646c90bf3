package sandbox

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/template"
)

// A template's process settings reach its sandboxes two ways: its default
// environment, user and working directory through envd's start (spec env
// and flags, so a ready snapshot holds them too), and its start command by
// runStart on every boot — the ready snapshot then holds the running
// process, and restores skip it.

// templateProcess returns the spec's environment (the defaults given, the
// template's variables, then the sandbox's own, each key once, a default
// never overridden but for PATH) and envd's
// command line for a sandbox of the template.
func (m *Manager) templateProcess(sb Sandbox, base []string) (env, args []string) {
	t, _ := m.d.Templates.Get(sb.Template)
	args = []string{template.EnvdPath}
	if t.User != "" {
		args = append(args, "-user", t.User)
	}
	if t.Workdir != "" {
		args = append(args, "-workdir", t.Workdir)
	}
	set := map[string]string{}
	for k, v := range t.Env {
		set[k] = v
	}
	for k, v := range sb.EnvVars {
		set[k] = v
	}
	// The defaults win (envd's access token among them: a sandbox's
	// variables must not unset it), except PATH, which the image's or
	// the sandbox's replaces.
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if v, ok := set[k]; ok && k == "PATH" {
			kv = k + "=" + v
		}
		env = append(env, kv)
		delete(set, k)
	}
	keys := make([]string, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		env = append(env, k+"="+set[k])
	}
	return env, args
}

// startOutputMax bounds the start command's output kept for an error.
const startOutputMax = 4 << 10

// runStart runs the template's start command in a booted sandbox and waits
// until its ready check passes. The command keeps running; only the
// stream that started it ends. A failure says why, with the command's
// output; the caller removes the sandbox.
func (m *Manager) runStart(ctx context.Context, sb Sandbox) error {
	t, err := m.d.Templates.Get(sb.Template)
	if err != nil || t.StartCmd == "" {
		return nil
	}
	timeout := time.Duration(t.ReadyTimeout) * time.Second
	if timeout <= 0 {
		timeout = template.DefaultReadyTimeout * time.Second
	}
	// No deadline on the start request either: envd ends a command when
	// its request's deadline passes.
	sctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	out := &tailBuffer{max: startOutputMax}
	ended := make(chan string, 1)
	wait, err := m.envd.Start(sctx, envdOf(sb), t.StartCmd, "start", out)
	if err != nil {
		return fmt.Errorf("start command: %w", err)
	}
	go func() { ended <- wait() }()
	deadline := time.Now().Add(timeout)
	if t.ReadyCmd == "" {
		// Ready when the command has run for a second without failing.
		deadline = time.Now().Add(time.Second)
	}
	var check string
	for {
		select {
		case status := <-ended:
			if status != "exit status 0" {
				return startErr(t, "the start command ended ("+status+") before the sandbox was ready", out, "")
			}
			// A command that daemonizes and exits 0 is fine: keep checking.
			ended = nil
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		if t.ReadyCmd == "" {
			if time.Now().After(deadline) {
				return nil
			}
			continue
		}
		ok, res := readyCheck(ctx, m.envd, sb, t.ReadyCmd)
		if ok {
			m.d.Log.Debug("start command ready", "sandbox", sb.ID, "template", sb.Template)
			return nil
		}
		check = res
		if time.Now().After(deadline) {
			return startErr(t, fmt.Sprintf("the ready check did not pass within %s", timeout), out, check)
		}
	}
}

// readyCheck runs the ready command once (at most 10 s).
func readyCheck(ctx context.Context, c Envd, sb Sandbox, cmd string) (bool, string) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out := &tailBuffer{max: 1 << 10}
	status := c.Run(cctx, envdOf(sb), cmd, out)
	return status == "exit status 0", strings.TrimSpace(status + ": " + out.String())
}

func startErr(t template.Template, what string, out *tailBuffer, check string) error {
	msg := fmt.Sprintf("template %s: %s; start command %q", t.Name, what, t.StartCmd)
	if check != "" {
		msg += fmt.Sprintf("; ready check %q last gave %q", t.ReadyCmd, check)
	}
	msg += fmt.Sprintf("; start command output: %q", strings.TrimSpace(out.String()))
	return errdefs.Invalid("%s (fix the template's start or ready command and build it again)", msg)
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = t.b[len(t.b)-t.max:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}
