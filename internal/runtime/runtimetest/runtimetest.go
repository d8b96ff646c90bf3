// Package runtimetest is the conformance suite every runtime.Runtime
// implementation must pass: one shared set of tests for the contract in
// package runtime, run against real sandboxes. It must not depend on any
// one implementation.
package runtimetest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/runtime"
	"github.com/agentenv/agentenv/internal/runtime/cgroups"
)

// Env is what the suite needs from the host.
type Env struct {
	// Image is an EROFS image of a busybox root filesystem (with /bin/sh).
	Image string
	// Dir is a scratch directory for sandbox directories and checkpoints.
	Dir string
	// CgroupParent, if set, is where the runtime makes sandbox cgroups:
	// a failed create must leave none there.
	CgroupParent string
}

// NewFunc returns a fresh runtime for one test.
type NewFunc func(t *testing.T) runtime.Runtime

var seq int

func spec(t *testing.T, env Env, args ...string) runtime.Spec {
	t.Helper()
	seq++
	// Fixed-width IDs: runtimes may match IDs by prefix.
	id := fmt.Sprintf("rtt%06d%011d", seq, time.Now().UnixNano()%1e11)
	dir := filepath.Join(env.Dir, id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if len(args) == 0 {
		args = []string{"/bin/sh", "-c", "echo started > /tmp/started; exec sleep 100000"}
	}
	return runtime.Spec{ID: id, Dir: dir, Image: env.Image, Args: args, Env: []string{"PATH=/bin"}, Cwd: "/", Pids: 256, MemoryMB: 256, CPUs: 1}
}

func exec(t *testing.T, r runtime.Runtime, id, script string) string {
	t.Helper()
	ex, ok := r.(runtime.Execer)
	if !ok {
		t.Skip("runtime does not implement Execer")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code, out, err := ex.Exec(ctx, id, []string{"/bin/sh", "-c", script})
	if err != nil || code != 0 {
		t.Fatalf("exec %q in %s: code %d, err %v, output %q", script, id, code, err, out)
	}
	return string(out)
}

// canExec says whether the checks can look inside r's sandboxes; those
// that only look skip without it, the others check what they can.
func canExec(r runtime.Runtime) bool {
	_, ok := r.(runtime.Execer)
	return ok
}

func mustState(t *testing.T, r runtime.Runtime, id string, want runtime.Status) {
	t.Helper()
	got, err := r.State(context.Background(), id)
	if err != nil {
		t.Fatalf("state %s: %v", id, err)
	}
	if got != want {
		t.Fatalf("state %s = %s, want %s", id, got, want)
	}
}

// Run runs the suite, one named subtest per check (go test -run
// 'Suite/PauseResume'). A check needing an optional interface the runtime
// lacks (Pauser, Checkpointer, Watcher, Execer) skips and says which.
func Run(t *testing.T, env Env, newRuntime NewFunc) {
	ctx := context.Background()
	t.Run("CreateStateDestroy", func(t *testing.T) {
		r := newRuntime(t)
		s := spec(t, env)
		if err := r.Create(ctx, s); err != nil {
			t.Fatalf("create: %v", err)
		}
		mustState(t, r, s.ID, runtime.StatusRunning)
		ids, err := r.List(ctx)
		if err != nil || !slices.Contains(ids, s.ID) {
			t.Errorf("list = %v, %v; want it to contain %s", ids, err, s.ID)
		}
		if canExec(r) {
			if got := exec(t, r, s.ID, "cat /tmp/started"); got != "started\n" {
				t.Errorf("init process output %q", got)
			}
		}
		if err := r.Destroy(ctx, s.ID); err != nil {
			t.Fatalf("destroy: %v", err)
		}
		mustState(t, r, s.ID, runtime.StatusUnknown)
		if err := r.Destroy(ctx, s.ID); err != nil {
			t.Errorf("second destroy must succeed (idempotent): %v", err)
		}
		if ids, _ := r.List(ctx); slices.Contains(ids, s.ID) {
			t.Errorf("destroyed sandbox still listed")
		}
	})
	t.Run("UnknownIsNotAnError", func(t *testing.T) {
		r := newRuntime(t)
		mustState(t, r, "rtt-never-created-000000", runtime.StatusUnknown)
		if err := r.Destroy(ctx, "rtt-never-created-000000"); err != nil {
			t.Errorf("destroy unknown: %v", err)
		}
	})
	t.Run("FailedCreateLeavesNothing", func(t *testing.T) {
		r := newRuntime(t)
		s := spec(t, env)
		s.Image = filepath.Join(env.Dir, "no-such-image.erofs")
		if err := r.Create(ctx, s); err == nil {
			t.Fatal("create with a missing image succeeded")
		}
		mustState(t, r, s.ID, runtime.StatusUnknown)
		if ids, _ := r.List(ctx); slices.Contains(ids, s.ID) {
			t.Errorf("failed create left a listed sandbox")
		}
		if env.CgroupParent != "" {
			if left := cgroups.Left(env.CgroupParent, s.ID); len(left) > 0 {
				t.Errorf("failed create left cgroups: %v", left)
			}
		}
	})
	t.Run("WritesStayInSandbox", func(t *testing.T) {
		r := newRuntime(t)
		a, b := spec(t, env), spec(t, env)
		for _, s := range []runtime.Spec{a, b} {
			if err := r.Create(ctx, s); err != nil {
				t.Fatalf("create: %v", err)
			}
			t.Cleanup(func() { r.Destroy(ctx, s.ID) })
		}
		exec(t, r, a.ID, "echo a > /etc/only-a")
		if out := exec(t, r, b.ID, "ls /etc"); strings.Contains(out, "only-a") {
			t.Errorf("a write in one sandbox is visible in another")
		}
	})
	t.Run("PauseResume", func(t *testing.T) {
		r := newRuntime(t)
		p, ok := r.(runtime.Pauser)
		if !ok {
			t.Skip("runtime does not implement Pauser")
		}
		s := spec(t, env)
		if err := r.Create(ctx, s); err != nil {
			t.Fatalf("create: %v", err)
		}
		t.Cleanup(func() { r.Destroy(ctx, s.ID) })
		if err := p.Pause(ctx, s.ID); err != nil {
			t.Fatalf("pause: %v", err)
		}
		mustState(t, r, s.ID, runtime.StatusPaused)
		if err := p.Resume(ctx, s.ID); err != nil {
			t.Fatalf("resume: %v", err)
		}
		mustState(t, r, s.ID, runtime.StatusRunning)
		if canExec(r) {
			exec(t, r, s.ID, "true")
		}
	})
	t.Run("CheckpointRestore", func(t *testing.T) {
		r := newRuntime(t)
		cp, ok := r.(runtime.Checkpointer)
		if !ok {
			t.Skip("runtime does not implement Checkpointer")
		}
		args := []string{"/bin/sh", "-c", "V=$$-$RANDOM; echo $V > /tmp/v; while true; do echo $V > /tmp/alive; sleep 0.05; done"}
		s := spec(t, env, args...)
		if err := r.Create(ctx, s); err != nil {
			t.Fatalf("create: %v", err)
		}
		t.Cleanup(func() { r.Destroy(ctx, s.ID) })
		var v string
		for range 100 {
			if v = exec(t, r, s.ID, "cat /tmp/v 2>/dev/null || true"); v != "" {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		img := filepath.Join(env.Dir, s.ID+"-ckpt")
		if err := cp.Checkpoint(ctx, s.ID, img); err != nil {
			t.Fatalf("checkpoint: %v", err)
		}
		mustState(t, r, s.ID, runtime.StatusRunning)
		for i := range 2 {
			c := spec(t, env, args...)
			if err := cp.Restore(ctx, c, img); err != nil {
				t.Fatalf("restore %d: %v", i, err)
			}
			t.Cleanup(func() { r.Destroy(ctx, c.ID) })
			mustState(t, r, c.ID, runtime.StatusRunning)
			if got := exec(t, r, c.ID, "cat /tmp/v"); got != v {
				t.Errorf("restore %d: /tmp/v = %q, want %q", i, got, v)
			}
			// The loop runs on after the restore: it rewrites /tmp/alive.
			exec(t, r, c.ID, "rm /tmp/alive; for i in $(seq 1 100); do [ -f /tmp/alive ] && exit 0; sleep 0.02; done; exit 1")
		}
	})
	t.Run("DiskLayer", func(t *testing.T) { diskLayer(t, env, newRuntime(t)) })
	t.Run("Layers", func(t *testing.T) { layers(t, env, newRuntime(t)) })
	t.Run("LayersXattrs", func(t *testing.T) { layersXattrs(t, env, newRuntime(t)) })
	t.Run("Watcher", func(t *testing.T) {
		r := newRuntime(t)
		w, ok := r.(runtime.Watcher)
		if !ok {
			t.Skip("runtime does not implement Watcher")
		}
		s := spec(t, env)
		if err := r.Create(ctx, s); err != nil {
			t.Fatalf("create: %v", err)
		}
		t.Cleanup(func() { r.Destroy(ctx, s.ID) })
		exited, err := w.Exited(ctx, s.ID)
		if err != nil {
			t.Fatalf("exited: %v", err)
		}
		select {
		case <-exited:
			t.Fatal("exited fired for a running sandbox")
		case <-time.After(100 * time.Millisecond):
		}
		if err := r.Destroy(ctx, s.ID); err != nil {
			t.Fatal(err)
		}
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			t.Fatal("exited did not fire within 10s of destroy")
		}
	})
}
