package sandbox

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/envdclient"
	"github.com/agentenv/agentenv/internal/template"
)

// fakeEnvd is an Envd whose start command prints startOut and then runs
// until its context ends, or ends at once with startEnd; its ready check
// fails failChecks times before it passes.
type fakeEnvd struct {
	Envd               // the calls a test does not expect panic
	startOut, startEnd string
	failChecks         int32
	checks             atomic.Int32
}

func (f *fakeEnvd) Start(ctx context.Context, _ envdclient.Target, _, _ string, out io.Writer) (func() string, error) {
	io.WriteString(out, f.startOut)
	return func() string {
		if f.startEnd != "" {
			return f.startEnd
		}
		<-ctx.Done()
		return "stream ended"
	}, nil
}

func (f *fakeEnvd) Run(context.Context, envdclient.Target, string, io.Writer) string {
	if f.checks.Add(1) <= f.failChecks {
		return "exit status 1"
	}
	return "exit status 0"
}

// startManager is a manager over a template "img" with a start and a
// ready command, and envd faked.
func startManager(t *testing.T, fe *fakeEnvd) *Manager {
	t.Helper()
	dir := t.TempDir()
	envdBin := filepath.Join(dir, "envd")
	os.WriteFile(envdBin, []byte("envd"), 0o755)
	os.MkdirAll(filepath.Join(dir, "templates", "img"), 0o755)
	tpl := `{"name":"img","startCmd":"serve","readyCmd":"check","readyTimeout":5}`
	os.WriteFile(filepath.Join(dir, "templates", "img", "template.json"), []byte(tpl), 0o644)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	store, err := template.Open(filepath.Join(dir, "templates"), envdBin, log)
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(Deps{Dir: filepath.Join(dir, "sandboxes"), Templates: store, Envd: fe, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// runStart waits for the ready check, and a start command that fails
// says so with its output: lifecycle logic tested without a sandbox.
func TestRunStartWithFakeEnvd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sb := Sandbox{ID: "i1", Template: "img"}

	ready := &fakeEnvd{failChecks: 2}
	if err := startManager(t, ready).runStart(ctx, sb); err != nil {
		t.Errorf("start command that becomes ready: %v", err)
	}
	if got := ready.checks.Load(); got != 3 {
		t.Errorf("got %d ready checks, want 3 (two failures, then ready)", got)
	}

	failed := &fakeEnvd{startOut: "bind: address in use", startEnd: "exit status 2", failChecks: 1 << 30}
	err := startManager(t, failed).runStart(ctx, sb)
	if err == nil || !strings.Contains(err.Error(), "exit status 2") || !strings.Contains(err.Error(), "bind: address in use") {
		t.Errorf("start command that fails: got %v, want its status and output", err)
	}
}
