package gvisorgo

import (
	"context"
	"errors"
	"fmt"
	"github.com/agentenv/agentenv/internal/runtime/cgroups"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/runtime"
)

// TestManyCreatesAtOnce runs rounds of 16 create → exec → destroy cycles at
// once (more than there are workers, so requests queue), with no failure
// allowed, then checks that nothing of any sandbox is left and that the
// workers reaped every sandbox process and kept few descriptors. Run it
// with -race: the request path is shared by every create.
func TestManyCreatesAtOnce(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, workers := range []int{0 /* the default */, 4} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			g := e.newRuntimeConfig(t, Config{Root: filepath.Join(e.dir, fmt.Sprint("root", workers)), Workers: workers})
			const n, rounds = 16, 3
			var ids []string
			for round := range rounds {
				specs := make([]runtime.Spec, n)
				for i := range specs {
					specs[i] = e.spec(t, g)
					ids = append(ids, specs[i].ID)
				}
				errs := make([]error, n)
				var wg sync.WaitGroup
				for i, s := range specs {
					wg.Go(func() { errs[i] = cycle(ctx, g, s) })
				}
				wg.Wait()
				for i, err := range errs {
					if err != nil {
						t.Errorf("round %d, sandbox %d: %v", round, i, err)
					}
				}
			}
			if t.Failed() {
				return
			}
			checkNothingLeft(t, g, ids)
			for _, pid := range g.pool.workerPids() {
				if n := countFDs(pid); n > 32 {
					t.Errorf("worker %d holds %d descriptors after %d creates, want a few", pid, n, n*rounds)
				}
			}
		})
	}
}

// cycle creates s, checks that a command runs in it and destroys it.
func cycle(ctx context.Context, g *Gvisor, s runtime.Spec) error {
	if err := g.Create(ctx, s); err != nil {
		return fmt.Errorf("create: %w", err)
	}
	code, out, err := g.Exec(ctx, s.ID, []string{"/bin/sh", "-c", "echo " + s.ID})
	if err != nil || code != 0 || strings.TrimSpace(string(out)) != s.ID {
		return fmt.Errorf("exec: code %d, err %v, output %q", code, err, out)
	}
	return g.Destroy(ctx, s.ID)
}

// TestCreateWithManyOpenFiles holds many descriptors in this process, as a
// server with hundreds of sandboxes and connections does. With gVisor's
// create in-process, every create failed while this process's lowest free
// descriptor was 246-248 ("unable to remap stdios, FD 253 is already in
// use"); in workers, this process's descriptor table does not matter.
func TestCreateWithManyOpenFiles(t *testing.T) {
	e := newEnv(t)
	g := e.newRuntime(t, "root")
	ctx := context.Background()
	var held []int
	defer func() {
		for _, fd := range held {
			unix.Close(fd)
		}
	}()
	// fill takes descriptors until the lowest free one is want.
	fill := func(want int) {
		for {
			fd, err := unix.Open(os.DevNull, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			if fd >= want {
				unix.Close(fd)
				return
			}
			held = append(held, fd)
		}
	}
	for _, lowest := range []int{244, 245, 246, 247, 248, 249, 250, 253, 300} {
		fill(lowest)
		if err := cycle(ctx, g, e.spec(t, g)); err != nil {
			t.Errorf("with %d descriptors open here: %v", lowest, err)
		}
	}
}

// TestWorkerDiesMidRequest makes every worker exit right after it has
// created a sandbox process, before it starts or restores it: the request
// fails with a clear error, nothing of the sandbox is left, and the workers
// are replaced.
func TestWorkerDiesMidRequest(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	// A checkpoint to restore, made by a runtime whose workers behave.
	good := e.newRuntime(t, "root")
	src := e.spec(t, good)
	if err := good.Create(ctx, src); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(src.Dir, "ckpt")
	if err := good.Checkpoint(ctx, src.ID, img); err != nil {
		t.Fatal(err)
	}

	g := e.newRuntimeConfig(t, Config{Root: filepath.Join(e.dir, "root"), testOnlyExitAfterSpawn: true})
	for _, op := range []struct {
		name string
		do   func(runtime.Spec) error
	}{
		{"Create", func(s runtime.Spec) error { return g.Create(ctx, s) }},
		{"Prepare", func(s runtime.Spec) error { return g.Prepare(ctx, s) }},
		{"Restore", func(s runtime.Spec) error { return g.Restore(ctx, s, img) }},
	} {
		t.Run(op.name, func(t *testing.T) {
			before := g.pool.workerPids()
			slices.Sort(before)
			s := e.spec(t, g)
			err := op.do(s)
			if !errors.Is(err, errWorker) || !errors.Is(err, errdefs.ErrUnavailable) {
				t.Fatalf("%s with a dying worker: %v; want a worker failure (unavailable)", op.name, err)
			}
			checkNothingLeft(t, g, []string{s.ID})
			eventually(t, "a new worker", func() bool {
				now := g.pool.workerPids()
				slices.Sort(now)
				return len(now) == len(before) && !slices.Equal(now, before)
			})
		})
	}
	// The source sandbox, on the same state directory, was not touched.
	if st, err := good.State(ctx, src.ID); err != nil || st != runtime.StatusRunning {
		t.Errorf("state of the first runtime's sandbox = %s, %v; want running", st, err)
	}
}

// TestWorkerDeathKeepsSandboxes kills every worker: the sandboxes they
// started keep running and stay usable, their exit is still seen, new
// workers take the next creates, and another runtime adopts the sandboxes.
func TestWorkerDeathKeepsSandboxes(t *testing.T) {
	e := newEnv(t)
	g := e.newRuntime(t, "root")
	ctx := context.Background()
	a, b := e.spec(t, g), e.spec(t, g)
	for _, s := range []runtime.Spec{a, b} {
		if err := g.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	exited, err := g.Exited(ctx, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	killed := map[int]bool{}
	for _, pid := range g.pool.workerPids() {
		unix.Kill(pid, unix.SIGKILL)
		killed[pid] = true
	}
	// No sleep before the create below: the pool must not hand it to a
	// killed worker its watcher has not seen die yet.
	if err := cycle(ctx, g, e.spec(t, g)); err != nil {
		t.Errorf("create right after the workers were killed: %v", err)
	}
	eventually(t, "workers replaced", func() bool {
		pids := g.pool.workerPids()
		for _, p := range pids {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", p)); err != nil || killed[p] {
				return false
			}
		}
		return len(pids) >= 2
	})
	for _, s := range []runtime.Spec{a, b} {
		if st, err := g.State(ctx, s.ID); err != nil || st != runtime.StatusRunning {
			t.Fatalf("state of %s after its worker died = %s, %v; want running", s.ID, st, err)
		}
		mustExec(t, g, s.ID, "true")
	}
	select {
	case <-exited:
		t.Fatal("Exited fired when the worker died, not the sandbox")
	default:
	}
	if err := cycle(ctx, g, e.spec(t, g)); err != nil {
		t.Errorf("create after the workers died: %v", err)
	}

	// Another runtime on the same state directory adopts b.
	other := e.newRuntime(t, "root")
	if st, err := other.State(ctx, b.ID); err != nil || st != runtime.StatusRunning {
		t.Errorf("state of %s in another runtime = %s, %v; want running", b.ID, st, err)
	}
	mustExec(t, other, b.ID, "true")

	c, err := g.load(a.ID, false)
	if err != nil {
		t.Fatal(err)
	}
	pid := c.SandboxPid()
	if err := g.Destroy(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("Exited did not fire after Destroy")
	}
	// Its process was re-parented (as after `runsc create`): it is gone, or
	// a zombie of an init that does not reap (as on some CI hosts).
	if st := procState(pid); st != "" && st != "Z" {
		t.Errorf("sandbox process %d is in state %s after Destroy", pid, st)
	}
	checkNothingLeft(t, g, []string{a.ID})
}

// checkNothingLeft fails the test if anything of the given sandboxes is
// still on the host: runsc state, processes, cgroups, mounts, or a zombie
// child of a worker.
func checkNothingLeft(t *testing.T, g *Gvisor, ids []string) {
	t.Helper()
	left := func() []string {
		var out []string
		listed, err := g.List(context.Background())
		if err != nil {
			return []string{"list: " + err.Error()}
		}
		for _, id := range ids {
			if slices.Contains(listed, id) {
				out = append(out, id+": runsc state")
			}
		}
		procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		for _, p := range procs {
			b, err := os.ReadFile(p)
			if err != nil {
				continue
			}
			for _, id := range ids {
				if strings.Contains(string(b), id) {
					out = append(out, fmt.Sprintf("%s: process %s", id, filepath.Dir(p)))
				}
			}
		}
		for _, id := range ids {
			for _, c := range cgroups.Left(g.Parent, id) {
				out = append(out, id+": cgroup "+c)
			}
		}
		mounts, _ := os.ReadFile("/proc/self/mountinfo")
		for _, id := range ids {
			if strings.Contains(string(mounts), id) {
				out = append(out, id+": mount")
			}
		}
		workers := g.pool.workerPids()
		stats, _ := filepath.Glob("/proc/[0-9]*/stat")
		for _, p := range stats {
			b, err := os.ReadFile(p)
			if err != nil {
				continue
			}
			// pid (comm) state ppid ...
			f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
			if len(f) > 1 && f[0] == "Z" {
				if ppid, _ := strconv.Atoi(f[1]); slices.Contains(workers, ppid) {
					out = append(out, "zombie child of a worker: "+filepath.Dir(p))
				}
			}
		}
		return out
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := left()
		if len(got) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("left behind: %s", strings.Join(got, "; "))
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func countFDs(pid int) int {
	d, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(d)
}

// procState returns the state letter of process pid, or "" if it is gone.
func procState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) == 0 {
		return ""
	}
	return f[0]
}
