package gvisorgo

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/runtime"
	"github.com/agentenv/agentenv/internal/template"
	"github.com/agentenv/agentenv/internal/testenv"
)

// shared holds what the tests and benchmarks of this package share: one
// busybox image (building envd and the image takes seconds) in a directory
// removed after the last test.
var shared struct {
	once  sync.Once
	dir   string
	image string
	err   error
}

func TestMain(m *testing.M) {
	WorkerMain()
	code := m.Run()
	if shared.dir != "" {
		os.RemoveAll(shared.dir)
	}
	os.Exit(code)
}

// testEnv is a place for sandboxes of one test: the busybox image, a
// scratch directory, and the runsc binary.
type testEnv struct {
	image, dir, runsc string
}

// newEnv skips (or fails, in CI) without root and runsc, and returns a
// fresh scratch directory with the shared busybox image.
func newEnv(tb testing.TB) testEnv {
	tb.Helper()
	runsc := testenv.NeedRunsc(tb)
	shared.once.Do(func() {
		shared.dir, shared.err = os.MkdirTemp("", "gvisorgo-test-")
		if shared.err != nil {
			return
		}
		var store *template.Store
		store, shared.err = template.Open(filepath.Join(shared.dir, "templates"), testenv.BuildEnvd(tb, shared.dir), slog.New(slog.NewTextHandler(io.Discard, nil)))
		if shared.err == nil {
			shared.err = store.EnsureBusybox(context.Background())
			shared.image = store.ImagePath("busybox")
		}
	})
	if shared.err != nil {
		tb.Fatalf("busybox image: %v", shared.err)
	}
	return testEnv{image: shared.image, dir: tb.TempDir(), runsc: runsc}
}

// newRuntime returns a runtime on a state directory of its own, closed
// when the test ends (after the sandboxes of e.spec are destroyed).
func (e testEnv) newRuntime(tb testing.TB, root string) *Gvisor {
	tb.Helper()
	return e.newRuntimeConfig(tb, Config{Root: filepath.Join(e.dir, root)})
}

// newRuntimeConfig is newRuntime with more settings; runsc and cgroups are
// set here.
func (e testEnv) newRuntimeConfig(tb testing.TB, cfg Config) *Gvisor {
	tb.Helper()
	cfg.Runsc, cfg.Cgroups = e.runsc, true
	g, err := New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { g.Close() })
	return g
}

var seq atomic.Int64

// spec returns a fresh sandbox spec running args (an idle shell by default).
// The sandbox is destroyed when the test ends, whatever happens, through
// the given runtime.
func (e testEnv) spec(tb testing.TB, r runtime.Runtime, args ...string) runtime.Spec {
	tb.Helper()
	// Fixed-width IDs: runsc matches IDs by prefix.
	id := fmt.Sprintf("ggo%06d%011d", seq.Add(1), time.Now().UnixNano()%1e11)
	d := filepath.Join(e.dir, id)
	if err := os.MkdirAll(d, 0o700); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := r.Destroy(context.Background(), id); err != nil {
			tb.Errorf("destroy %s: %v", id, err)
		}
	})
	if len(args) == 0 {
		args = []string{"/bin/sh", "-c", "exec sleep 100000"}
	}
	return runtime.Spec{ID: id, Dir: d, Image: e.image, Args: args,
		Env: []string{"PATH=/bin"}, Cwd: "/", Pids: 256, MemoryMB: 256, CPUs: 1}
}

// eventually polls cond every 10ms until it holds or 30s have passed (a
// safety net: a loaded host can stall a sandbox for seconds).
func eventually(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func mustExec(tb testing.TB, r runtime.Execer, id, script string) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code, out, err := r.Exec(ctx, id, []string{"/bin/sh", "-c", script})
	if err != nil || code != 0 {
		tb.Fatalf("exec %q in %s: code %d, err %v, output %q", script, id, code, err, out)
	}
	return string(out)
}
