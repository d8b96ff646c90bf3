package gvisorgo

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/runtime"
	"github.com/agentenv/agentenv/internal/runtime/gvisor"
	"github.com/agentenv/agentenv/internal/runtime/ocispec"
)

// BenchmarkRuntimes measures each lifecycle operation of this runtime ("go")
// beside the CLI runtime of internal/runtime/gvisor ("cli") in the same run,
// on the busybox template with the same specs, with cgroups as the server
// runs them. Every iteration runs the operation once on each runtime, so
// both see the same host load; each sub-benchmark reports the medians as
// go-p50-ms and cli-p50-ms (ns/op is not meaningful: it includes untimed
// set-up). Run it as root:
//
//	go test -run '^$' -bench Runtimes -benchtime 30x ./internal/runtime/gvisorgo/
func BenchmarkRuntimes(b *testing.B) { benchRuntimes(b, true) }

// BenchmarkRuntimesNoCgroups is BenchmarkRuntimes with --ignore-cgroups, the
// conditions of the measurements in ARCHITECTURE.md. On a cgroup v1 host,
// cgroups add the join and leave of the sandbox's cgroups to every create.
func BenchmarkRuntimesNoCgroups(b *testing.B) { benchRuntimes(b, false) }

func benchRuntimes(b *testing.B, cgroups bool) {
	e := newEnv(b)
	env := benchEnv{testEnv: e, cliRoot: filepath.Join(e.dir, "root-cli"), cgroups: cgroups}
	goRT, err := New(Config{Runsc: e.runsc, Root: filepath.Join(e.dir, "root-go"), Cgroups: cgroups})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { goRT.Close() })
	cliRT, err := gvisor.New(gvisor.Config{Runsc: e.runsc, Root: env.cliRoot, Cgroups: cgroups})
	if err != nil {
		b.Fatal(err)
	}
	rts := []benchRT{{"go", goRT}, {"cli", cliRT}}
	for _, op := range []struct {
		name string
		// setup prepares one runtime and returns the operation to time.
		setup func(*testing.B, benchEnv, runtime.Runtime) func(i int) time.Duration
	}{
		{"CreateStart", setupCreateStart},
		{"Pause", setupPause},
		{"Resume", setupResume},
		{"Exec", setupExec},
		{"CheckpointIdle", setupCheckpoint},
		{"Restore", setupRestore},
		{"RestorePrepared", setupRestorePrepared},
	} {
		b.Run(op.name, func(b *testing.B) {
			ops := make([]func(int) time.Duration, len(rts))
			t := make([]timings, len(rts))
			for j, rt := range rts {
				ops[j] = op.setup(b, env, rt.r)
			}
			i := 0
			for b.Loop() {
				for j := range rts {
					t[j] = append(t[j], ops[j](i))
				}
				i++
			}
			for j, rt := range rts {
				t[j].report(b, rt.name)
			}
		})
	}
}

type benchRT struct {
	name string
	r    runtime.Runtime
}

type benchEnv struct {
	testEnv
	cliRoot string // the CLI runtime's state directory
	cgroups bool
}

// runscCmd runs a runsc command on the CLI runtime's state directory the
// way internal/runtime/gvisor does, with the sandbox's stdio on its console
// log.
func (e benchEnv) runscCmd(s runtime.Spec, args ...string) error {
	logf, err := os.OpenFile(consolePath(s.Dir), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	global := []string{"--root", e.cliRoot, "--platform", "systrap", "--network", "none"}
	if !e.cgroups {
		global = append(global, "--ignore-cgroups")
	}
	cmd := exec.Command(e.runsc, append(global, args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("runsc %s: %w%s", args[0], err, logTails(s.Dir))
	}
	return nil
}

func timed(fn func()) time.Duration {
	start := time.Now()
	fn()
	return time.Since(start)
}

// timings collects one duration per benchmark iteration.
type timings []time.Duration

func (t timings) report(b *testing.B, name string) {
	if len(t) == 0 {
		return
	}
	s := slices.Clone(t)
	slices.Sort(s)
	b.ReportMetric(float64(s[len(s)/2].Microseconds())/1000, name+"-p50-ms")
	b.ReportMetric(0, "ns/op")
}

func must(b *testing.B, err error) {
	b.Helper()
	if err != nil {
		b.Fatal(err)
	}
}

func running(b *testing.B, r runtime.Runtime, id string) {
	b.Helper()
	st, err := r.State(context.Background(), id)
	must(b, err)
	if st != runtime.StatusRunning {
		b.Fatalf("state of %s = %s, want running", id, st)
	}
}

// setupCreateStart times Create until State reports running.
func setupCreateStart(b *testing.B, e benchEnv, r runtime.Runtime) func(int) time.Duration {
	ctx := context.Background()
	return func(int) time.Duration {
		s := e.spec(b, r)
		d := timed(func() {
			must(b, r.Create(ctx, s))
			running(b, r, s.ID)
		})
		must(b, r.Destroy(ctx, s.ID))
		return d
	}
}

// idle returns a running idle sandbox.
func idle(b *testing.B, e benchEnv, r runtime.Runtime) runtime.Spec {
	s := e.spec(b, r)
	must(b, r.Create(context.Background(), s))
	return s
}

func setupPause(b *testing.B, e benchEnv, r runtime.Runtime) func(int) time.Duration {
	ctx := context.Background()
	p := r.(runtime.Pauser)
	s := idle(b, e, r)
	return func(int) time.Duration {
		d := timed(func() { must(b, p.Pause(ctx, s.ID)) })
		must(b, p.Resume(ctx, s.ID))
		return d
	}
}

func setupResume(b *testing.B, e benchEnv, r runtime.Runtime) func(int) time.Duration {
	ctx := context.Background()
	p := r.(runtime.Pauser)
	s := idle(b, e, r)
	return func(int) time.Duration {
		must(b, p.Pause(ctx, s.ID))
		d := timed(func() { must(b, p.Resume(ctx, s.ID)) })
		return d
	}
}

func setupExec(b *testing.B, e benchEnv, r runtime.Runtime) func(int) time.Duration {
	ctx := context.Background()
	x := r.(runtime.Execer)
	s := idle(b, e, r)
	return func(int) time.Duration {
		d := timed(func() {
			code, out, err := x.Exec(ctx, s.ID, []string{"/bin/true"})
			if err != nil || code != 0 {
				b.Fatalf("exec true: code %d, err %v, output %q", code, err, out)
			}
		})
		return d
	}
}

func setupCheckpoint(b *testing.B, e benchEnv, r runtime.Runtime) func(int) time.Duration {
	ctx := context.Background()
	cp := r.(runtime.Checkpointer)
	s := idle(b, e, r)
	return func(i int) time.Duration {
		img := filepath.Join(s.Dir, fmt.Sprintf("ckpt%d", i))
		d := timed(func() { must(b, cp.Checkpoint(ctx, s.ID, img)) })
		running(b, r, s.ID)
		os.RemoveAll(img)
		return d
	}
}

// checkpointed returns the image of an idle sandbox.
func checkpointed(b *testing.B, e benchEnv, r runtime.Runtime) string {
	ctx := context.Background()
	s := idle(b, e, r)
	img := filepath.Join(s.Dir, "ckpt")
	must(b, r.(runtime.Checkpointer).Checkpoint(ctx, s.ID, img))
	must(b, r.Destroy(ctx, s.ID))
	return img
}

// setupRestore times a restore into a new sandbox, until it runs.
func setupRestore(b *testing.B, e benchEnv, r runtime.Runtime) func(int) time.Duration {
	ctx := context.Background()
	img := checkpointed(b, e, r)
	return func(int) time.Duration {
		s := e.spec(b, r)
		d := timed(func() { must(b, r.(runtime.Checkpointer).Restore(ctx, s, img)) })
		running(b, r, s.ID)
		must(b, r.Destroy(ctx, s.ID))
		return d
	}
}

// setupRestorePrepared times a restore into a sandbox created in advance:
// by Prepare here, by `runsc create` for the CLI (its runtime has no such
// method, so this runs the two runsc commands itself).
func setupRestorePrepared(b *testing.B, e benchEnv, r runtime.Runtime) func(int) time.Duration {
	ctx := context.Background()
	img := checkpointed(b, e, r)
	return func(int) time.Duration {
		var d time.Duration
		s := e.spec(b, r)
		switch r := r.(type) {
		case *Gvisor:
			must(b, r.Prepare(ctx, s))
			d = timed(func() { must(b, r.Restore(ctx, s, img)) })
		default:
			cg := ""
			if e.cgroups {
				cg = "/agentenv/" + s.ID
			}
			bundle, err := ocispec.WriteBundle(s, cg, r.(*gvisor.Gvisor).Features())
			must(b, err)
			must(b, e.runscCmd(s, "create", "--bundle", bundle, s.ID))
			d = timed(func() {
				must(b, e.runscCmd(s, "restore", "--detach", "--bundle", bundle, "--image-path", img, s.ID))
			})
		}
		running(b, r, s.ID)
		must(b, r.Destroy(ctx, s.ID))
		return d
	}
}
