package gvisorgo

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/internal/runtime"
	"github.com/agentenv/agentenv/internal/runtime/gvisor"
)

// TestCLIInterop checks that this runtime, the CLI runtime and the runsc CLI
// itself share one state directory: each sees and drives sandboxes made by
// the others, so a server can switch runtimes and `runsc delete --force`
// still cleans up.
func TestCLIInterop(t *testing.T) {
	e := newEnv(t)
	root := filepath.Join(e.dir, "root")
	g := e.newRuntime(t, "root")
	cli, err := gvisor.New(gvisor.Config{Runsc: e.runsc, Root: root, Cgroups: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	runsc := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(e.runsc, append([]string{"--root", root}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("runsc %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	want := func(r runtime.Runtime, id string, st runtime.Status) {
		t.Helper()
		got, err := r.State(ctx, id)
		if err != nil || got != st {
			t.Fatalf("%T state of %s = %s, %v; want %s", r, id, got, err, st)
		}
	}

	t.Run("MadeHere", func(t *testing.T) {
		s := e.spec(t, g)
		if err := g.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
		var st struct{ Status string }
		if err := json.Unmarshal([]byte(runsc("state", s.ID)), &st); err != nil || st.Status != "running" {
			t.Fatalf("runsc state: %+v, %v; want running", st, err)
		}
		if !slices.Contains(strings.Fields(runsc("list", "--quiet")), s.ID) {
			t.Errorf("runsc list does not show %s", s.ID)
		}
		if err := cli.Pause(ctx, s.ID); err != nil {
			t.Fatal(err)
		}
		want(g, s.ID, runtime.StatusPaused)
		if err := g.Resume(ctx, s.ID); err != nil {
			t.Fatal(err)
		}
		want(cli, s.ID, runtime.StatusRunning)
		mustExec(t, cli, s.ID, "true")
		runsc("delete", "--force", s.ID)
		want(g, s.ID, runtime.StatusUnknown)
	})

	t.Run("MadeByCLI", func(t *testing.T) {
		s := e.spec(t, cli)
		if err := cli.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
		want(g, s.ID, runtime.StatusRunning)
		mustExec(t, g, s.ID, "echo hi > /tmp/hi")
		exited, err := g.Exited(ctx, s.ID)
		if err != nil {
			t.Fatal(err)
		}
		img := filepath.Join(s.Dir, "ckpt")
		if err := g.Checkpoint(ctx, s.ID, img); err != nil {
			t.Fatal(err)
		}
		c := e.spec(t, g)
		if err := g.Restore(ctx, c, img); err != nil {
			t.Fatal(err)
		}
		if got := mustExec(t, cli, c.ID, "cat /tmp/hi"); got != "hi\n" {
			t.Errorf("restored sandbox: /tmp/hi = %q", got)
		}
		if err := g.Destroy(ctx, s.ID); err != nil {
			t.Fatal(err)
		}
		<-exited
		want(cli, s.ID, runtime.StatusUnknown)
	})
}
