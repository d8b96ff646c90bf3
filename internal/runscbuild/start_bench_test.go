package runscbuild

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	agentruntime "github.com/agentenv/agentenv/internal/runtime"
	"github.com/agentenv/agentenv/internal/runtime/ocispec"
	"github.com/agentenv/agentenv/internal/runtime/runscbin"
	"github.com/agentenv/agentenv/internal/testenv"
)

// benchFeatures are given to every bundle of BenchmarkRunscStart: a
// goferless write layer when both builds have patch 0002, so that the
// figures are agentenv's sandbox's.
var benchFeatures runscbin.Features

// BenchmarkRunscStart measures what starting and restoring a sandbox cost
// with the installed runsc (precompiled seccomp filters) and with the stub
// build (filters compiled at every start): the CPU time of every process
// involved, read from a cpuacct cgroup made for each run, and the wall time
// of the runsc call. The builds take turns, so both see the same host load.
// It reports medians; run it with -benchtime=20x (20 runs of each build):
//
//	go test -run '^$' -bench RunscStart -benchtime 20x ./internal/runscbuild
//
// run-true is `runsc run` of /bin/true (create, start, wait, destroy) on
// agentenv's spec (EROFS root, write layer on disk, a gofer); restore is
// `runsc restore --detach` of a checkpoint of `sleep` made by the same build.
func BenchmarkRunscStart(b *testing.B) {
	runsc := testenv.NeedRunsc(b)
	if _, err := os.Stat(StubPath); err != nil {
		b.Skipf("no stub runsc build at %s (run `make setup`)", StubPath)
	}
	testenv.NeedCommand(b, "mkfs.erofs", "EROFS root images (package erofs-utils)")
	builds := []runscBuild{{"precompiled", runsc}, {"stub", StubPath}}
	_, f1, err1 := runscbin.Version(runsc)
	_, f2, err2 := runscbin.Version(StubPath)
	if err := errors.Join(err1, err2); err != nil {
		b.Fatal(err)
	}
	benchFeatures = runscbin.Features{GoferlessFilestore: f1.GoferlessFilestore && f2.GoferlessFilestore}
	image := busyboxImage(b)
	acct := newCPUAcct(b)

	b.Run("run-true", func(b *testing.B) {
		root := b.TempDir()
		cpu, wall := map[string][]time.Duration{}, map[string][]time.Duration{}
		for i := 0; i < b.N; i++ {
			for _, bl := range turns(builds, i) {
				id := fmt.Sprintf("rt%d%s", i, bl.name)
				bundle := benchBundle(b, id, image, []string{"/bin/true"})
				c, w := acct.run(b, true, bl.bin, append(globalArgs(b, root), "run", "--bundle", bundle, id)...)
				cpu[bl.name], wall[bl.name] = append(cpu[bl.name], c), append(wall[bl.name], w)
			}
		}
		report(b, cpu, wall)
	})

	b.Run("restore", func(b *testing.B) {
		root := b.TempDir()
		images := map[string]string{}
		for _, bl := range builds {
			images[bl.name] = checkpointSleep(b, bl.bin, root, image, "ck"+bl.name)
		}
		cpu, wall := map[string][]time.Duration{}, map[string][]time.Duration{}
		for i := 0; i < b.N; i++ {
			for _, bl := range turns(builds, i) {
				id := fmt.Sprintf("rs%d%s", i, bl.name)
				bundle := benchBundle(b, id, image, []string{"/bin/sleep", "1000"})
				c, w := acct.run(b, false, bl.bin, append(globalArgs(b, root), "restore", "--detach", "--image-path", images[bl.name], "--bundle", bundle, id)...)
				cpu[bl.name], wall[bl.name] = append(cpu[bl.name], c), append(wall[bl.name], w)
				if out, err := exec.Command(bl.bin, append(globalArgs(b, root), "delete", "--force", id)...).CombinedOutput(); err != nil {
					b.Fatalf("delete %s: %v\n%s", id, err, out)
				}
			}
		}
		report(b, cpu, wall)
	})
}

type runscBuild struct{ name, bin string }

// turns returns the builds in the order of round i: each goes first every
// other round, so neither gains from the caches the other warms.
func turns(builds []runscBuild, i int) []runscBuild {
	if i%2 == 0 {
		return builds
	}
	return []runscBuild{builds[1], builds[0]}
}

// benchBundle writes agentenv's bundle for a sandbox running args.
func benchBundle(b *testing.B, id, image string, args []string) string {
	b.Helper()
	spec := agentruntime.Spec{ID: id, Dir: b.TempDir(), Image: image, DiskMB: 64, Args: args, Env: []string{"PATH=/bin"}}
	bundle, err := ocispec.WriteBundle(spec, "", benchFeatures)
	if err != nil {
		b.Fatal(err)
	}
	return bundle
}

// checkpointSleep starts `sleep` with bin and checkpoints it (the sandbox
// exits), returning the image directory.
func checkpointSleep(b *testing.B, bin, root, image, id string) string {
	b.Helper()
	bundle := benchBundle(b, id, image, []string{"/bin/sleep", "1000"})
	dir := b.TempDir()
	for _, args := range [][]string{
		{"run", "--detach", "--bundle", bundle, id},
		{"checkpoint", "--image-path", dir, id},
		{"delete", "--force", id},
	} {
		cmd := exec.Command(bin, append(globalArgs(b, root), args...)...)
		console, err := os.Create(filepath.Join(dir, "..", id+"."+args[0]+".log"))
		if err != nil {
			b.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = console, console // a sandbox keeps them: no pipes
		err = cmd.Run()
		console.Close()
		if err != nil {
			out, _ := os.ReadFile(console.Name())
			b.Fatalf("%s %s: %v\n%s", bin, args[0], err, out)
		}
	}
	return dir
}

// report logs and reports the medians of cpu and wall per build, and the
// median of the paired differences (stub minus precompiled, run i of each
// taken back to back), which the host's load drifts least.
func report(b *testing.B, cpu, wall map[string][]time.Duration) {
	b.Helper()
	for _, m := range []struct {
		name string
		d    map[string][]time.Duration
	}{{"cpu", cpu}, {"wall", wall}} {
		diff := make([]time.Duration, len(m.d["stub"]))
		for i := range diff {
			diff[i] = m.d["stub"][i] - m.d["precompiled"][i]
		}
		saved := median(diff)
		b.ReportMetric(float64(saved.Microseconds())/1000, m.name+"-ms-saved-p50")
		b.Logf("%s saved per run (stub - precompiled, paired): p50 %.1f ms", m.name, float64(saved.Microseconds())/1000)
	}
	for _, name := range slices.Sorted(maps.Keys(cpu)) {
		c, w := median(cpu[name]), median(wall[name])
		b.ReportMetric(float64(c.Microseconds())/1000, "cpu-ms-p50-"+name)
		b.ReportMetric(float64(w.Microseconds())/1000, "wall-ms-p50-"+name)
		b.Logf("%s: %d runs, CPU p50 %.1f ms, wall p50 %.1f ms", name, len(cpu[name]), float64(c.Microseconds())/1000, float64(w.Microseconds())/1000)
	}
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// cpuAcct counts the CPU time of a command and everything it starts in a
// cgroup of its own (cgroup v1 cpuacct, or v2): runsc's sandbox and gofer
// processes outlive or leave the caller, so rusage of children misses them.
type cpuAcct struct {
	base  string // parent directory of the per-run cgroups
	v2    bool
	count int
}

func newCPUAcct(b *testing.B) *cpuAcct {
	b.Helper()
	a := &cpuAcct{base: "/sys/fs/cgroup/cpuacct"}
	if _, err := os.Stat(filepath.Join(a.base, "cpuacct.usage")); err != nil {
		a.base, a.v2 = "/sys/fs/cgroup", true
		if _, err := os.Stat(filepath.Join(a.base, "cgroup.controllers")); err != nil {
			b.Skip("no cgroup v1 cpuacct or cgroup v2 hierarchy to count CPU time in")
		}
	}
	a.base = filepath.Join(a.base, fmt.Sprintf("agentenv-runscbench-%d", os.Getpid()))
	if err := os.Mkdir(a.base, 0o755); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.Remove(a.base) })
	return a
}

// run runs bin with args in a new cgroup and returns the CPU time of its
// processes and its wall time. With settle, the CPU time is read once every
// process of the run has exited; else when bin exits (a detached sandbox
// keeps running).
func (a *cpuAcct) run(b *testing.B, settle bool, bin string, args ...string) (cpu, wall time.Duration) {
	b.Helper()
	a.count++
	cg := filepath.Join(a.base, strconv.Itoa(a.count))
	if err := os.Mkdir(cg, 0o755); err != nil {
		b.Fatal(err)
	}
	a.removeLater(b, cg)
	console, err := os.Create(filepath.Join(b.TempDir(), "console"))
	if err != nil {
		b.Fatal(err)
	}
	defer console.Close()
	// The shell moves itself into the cgroup before it becomes runsc, so
	// every process of the run is counted from its first instruction.
	cmd := exec.Command("/bin/sh", append([]string{"-c", `echo $$ > "$0" && exec "$@"`, filepath.Join(cg, "cgroup.procs"), bin}, args...)...)
	cmd.Stdout, cmd.Stderr = console, console
	start := time.Now()
	err = cmd.Run()
	wall = time.Since(start)
	if err != nil {
		out, _ := os.ReadFile(console.Name())
		b.Fatalf("%s %v: %v\n%s", bin, args, err, out)
	}
	for deadline := time.Now().Add(5 * time.Second); settle; {
		procs, err := os.ReadFile(filepath.Join(cg, "cgroup.procs"))
		if err != nil {
			b.Fatal(err)
		}
		if len(strings.TrimSpace(string(procs))) == 0 {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("processes of %s %v still running 5 s after it exited: %s", bin, args, procs)
		}
		time.Sleep(time.Millisecond)
	}
	return a.usage(b, cg), wall
}

func (a *cpuAcct) usage(b *testing.B, cg string) time.Duration {
	b.Helper()
	if !a.v2 {
		raw, err := os.ReadFile(filepath.Join(cg, "cpuacct.usage"))
		if err != nil {
			b.Fatal(err)
		}
		ns, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
		if err != nil {
			b.Fatal(err)
		}
		return time.Duration(ns)
	}
	raw, err := os.ReadFile(filepath.Join(cg, "cpu.stat"))
	if err != nil {
		b.Fatal(err)
	}
	for _, l := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(l, "usage_usec "); ok {
			us, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return time.Duration(us) * time.Microsecond
		}
	}
	b.Fatalf("%s/cpu.stat has no usage_usec", cg)
	return 0
}

// removeLater removes cgroup cg at the end of the benchmark, once the
// processes left in it have gone (the caller deletes a restored sandbox).
func (a *cpuAcct) removeLater(b *testing.B, cg string) {
	b.Helper()
	b.Cleanup(func() {
		deadline := time.Now().Add(10 * time.Second)
		for {
			err := os.Remove(cg)
			if err == nil || os.IsNotExist(err) {
				return
			}
			if time.Now().After(deadline) {
				b.Errorf("remove cgroup %s: %v", cg, err)
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
}
