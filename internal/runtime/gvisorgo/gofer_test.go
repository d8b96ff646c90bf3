package gvisorgo

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/internal/runtime/ocispec"
)

// TestDiskLayerWithoutGofer checks patch 0002 (patches/gvisor): with the
// project's runsc, a sandbox with a write layer on disk runs without a
// gofer process, its layer file is where runsc destroy removes it, and /tmp
// is on the layer (the anchor mount keeps gVisor's memory tmpfs off it).
// runtimetest's disk layer test checks the layer itself on every runtime.
func TestDiskLayerWithoutGofer(t *testing.T) {
	e := newEnv(t)
	g := e.newRuntime(t, "runsc")
	if !g.Features.GoferlessFilestore {
		t.Fatalf("%s lacks the goferless filestore (patch 0002): run `make setup`", e.runsc)
	}
	ctx := context.Background()
	s := e.spec(t, g)
	s.DiskMB = 32
	if err := g.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	if got := runscProcesses(t, e.runsc, s.ID); !slices.Equal(got, []string{"boot"}) {
		t.Errorf("runsc processes of the sandbox: %q, want only the sandbox's (boot), no gofer", got)
	}
	if out := mustExec(t, g, s.ID, "df -k /tmp | tail -n 1 | awk '{print $2}'; ls -a /tmp"); !strings.HasPrefix(out, "32768\n") || !strings.Contains(out, ".agentenv") {
		t.Errorf("/tmp: %q, want the 32 MiB layer with the anchor in it", out)
	}
	if out := mustExec(t, g, s.ID, "touch /tmp/.agentenv/x 2>&1; echo rc=$?"); !strings.Contains(out, "rc=1") {
		t.Errorf("writing into the anchor: %q, want it refused (read-only)", out)
	}
	file := ocispec.FilestorePath(s.Dir, s.ID)
	fi, err := os.Stat(file)
	if err != nil {
		t.Fatalf("layer file: %v", err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("layer file mode %v, want 0600", fi.Mode().Perm())
	}
	if err := g.Destroy(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Errorf("layer file after destroy: %v, want it gone", err)
	}
	if got := runscProcesses(t, e.runsc, s.ID); len(got) != 0 {
		t.Errorf("runsc processes after destroy: %q, want none", got)
	}
}

// runscProcesses returns the subcommands (boot, gofer, ...) of the runsc
// processes whose last argument is id.
func runscProcesses(t *testing.T, runsc, id string) []string {
	t.Helper()
	var subs []string
	for _, args := range sandboxProcesses(runsc, id) {
		for _, a := range args[1:] {
			if !strings.HasPrefix(a, "-") {
				subs = append(subs, a)
				break
			}
		}
	}
	slices.Sort(subs)
	return subs
}
