package runscbuild

import (
	"bytes"
	"encoding/json"
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

// rootLowersAnnotation is patch 0008's annotation: EROFS images stacked
// below the rootfs image in the root overlay, top first, ":"-separated.
const rootLowersAnnotation = "dev.agentenv.rootfs.lowers"

// layersRunsc is the runsc build under test: AGENTENV_LAYERS_RUNSC, or the
// installed one. It must have patch 0008 (rootfs-lower-images).
func layersRunsc(tb testing.TB) string {
	tb.Helper()
	bin := os.Getenv("AGENTENV_LAYERS_RUNSC")
	if bin == "" {
		bin = testenv.NeedRunsc(tb)
	} else {
		testenv.NeedRoot(tb)
	}
	testenv.NeedCommand(tb, "mkfs.erofs", "EROFS root images (package erofs-utils)")
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		tb.Fatalf("%s --version: %v", bin, err)
	}
	if !strings.Contains(string(out), "rootfs-lower-images") {
		tb.Skipf("%s lacks patch 0008 (rootfs-lower-images); set AGENTENV_LAYERS_RUNSC to a build with it", bin)
	}
	_, f, err := runscbin.Version(bin)
	if err != nil {
		tb.Fatal(err)
	}
	benchFeatures = f
	return bin
}

// erofsImage writes files (path -> content; content "->x" is a symlink to
// x) into a new EROFS image and returns its path.
func erofsImage(tb testing.TB, files map[string]string) string {
	tb.Helper()
	dir := tb.TempDir()
	root := filepath.Join(dir, "root")
	os.MkdirAll(root, 0o755)
	for p, content := range files {
		dst := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			tb.Fatal(err)
		}
		if target, ok := strings.CutPrefix(content, "->"); ok {
			if err := os.Symlink(target, dst); err != nil {
				tb.Fatal(err)
			}
			continue
		}
		if err := os.WriteFile(dst, []byte(content), 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	image := filepath.Join(dir, "image.erofs")
	if out, err := exec.Command("mkfs.erofs", "-E", "noinline_data", image, root).CombinedOutput(); err != nil {
		tb.Fatalf("mkfs.erofs: %v\n%s", err, out)
	}
	return image
}

// baseFiles is a small root filesystem: busybox and the directories a
// sandbox needs.
func baseFiles(tb testing.TB) map[string]string {
	tb.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		tb.Fatalf("static busybox (package busybox-static): %v", err)
	}
	files := map[string]string{"bin/busybox": string(bb), "etc/layer": "base\n", "etc/base-only": "from the base\n"}
	for _, a := range []string{"sh", "cat", "sleep", "true", "echo", "ls"} {
		files["bin/"+a] = "->busybox"
	}
	for _, d := range []string{"proc", "dev", "sys", "tmp"} {
		files[d+"/.keep"] = ""
	}
	return files
}

// stack is a root filesystem as images: the rootfs image and those below
// it, top first.
type stack struct {
	name   string
	top    string
	lowers []string
}

// stacks builds the same content three ways: one image (today's
// template), the base plus one thin layer (fromTemplate base + one COPY of
// /task), and the base plus seven thin layers, each adding one file of
// /task and overriding /etc/layer.
//
// AGENTENV_LAYERS_BASE names a root tree to use as the base instead of
// busybox (such as a Debian template's, extracted with fsck.erofs
// --extract): the flat image is made from it with /task and /etc/layer
// added, which are removed after.
func stacks(tb testing.TB) []stack {
	tb.Helper()
	task := map[string]string{"etc/layer": "layer 7\n"}
	for i := 1; i <= 7; i++ {
		task[fmt.Sprintf("task/file%d", i)] = fmt.Sprintf("layer %d\n", i)
	}
	var baseImage, flatImage string
	if tree := os.Getenv("AGENTENV_LAYERS_BASE"); tree != "" {
		baseImage, flatImage = treeImages(tb, tree, task)
	} else {
		base := baseFiles(tb)
		flat := maps.Clone(base)
		maps.Copy(flat, task)
		baseImage, flatImage = erofsImage(tb, base), erofsImage(tb, flat)
	}
	var thin []string // top first
	for i := 7; i >= 1; i-- {
		thin = append(thin, erofsImage(tb, map[string]string{fmt.Sprintf("task/file%d", i): fmt.Sprintf("layer %d\n", i), "etc/layer": fmt.Sprintf("layer %d\n", i)}))
	}
	one := map[string]string{"etc/layer": "layer 7\n"} // every layer's files in one
	for i := 1; i <= 7; i++ {
		one[fmt.Sprintf("task/file%d", i)] = fmt.Sprintf("layer %d\n", i)
	}
	two := erofsImage(tb, one)
	return []stack{
		{name: "1-image", top: flatImage},
		{name: "2-layers", top: two, lowers: []string{baseImage}},
		{name: "8-layers", top: thin[0], lowers: append(slices.Clone(thin[1:]), baseImage)},
	}
}

// treeImages makes an image of tree, and one of tree with files added.
func treeImages(tb testing.TB, tree string, files map[string]string) (base, flat string) {
	tb.Helper()
	dir := tb.TempDir()
	base, flat = filepath.Join(dir, "base.erofs"), filepath.Join(dir, "flat.erofs")
	mkfs := func(image string) {
		if out, err := exec.Command("mkfs.erofs", "-E", "noinline_data", image, tree).CombinedOutput(); err != nil {
			tb.Fatalf("mkfs.erofs: %v\n%s", err, out)
		}
	}
	mkfs(base)
	saved := map[string][]byte{}
	for p, content := range files {
		dst := filepath.Join(tree, p)
		if old, err := os.ReadFile(dst); err == nil {
			saved[dst] = old
		}
		os.MkdirAll(filepath.Dir(dst), 0o755)
		if err := os.WriteFile(dst, []byte(content), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	mkfs(flat)
	for p := range files {
		dst := filepath.Join(tree, p)
		if old, ok := saved[dst]; ok {
			os.WriteFile(dst, old, 0o644)
		} else {
			os.Remove(dst)
		}
	}
	os.Remove(filepath.Join(tree, "task"))
	return base, flat
}

// layeredBundle writes agentenv's bundle (EROFS root, write layer on disk)
// for a sandbox on stack s running args.
func layeredBundle(tb testing.TB, id string, s stack, args []string) string {
	tb.Helper()
	spec := agentruntime.Spec{ID: id, Dir: tb.TempDir(), Image: s.top, DiskMB: 64, Args: args, Env: []string{"PATH=/bin"}}
	bundle := filepath.Join(spec.Dir, "bundle")
	rootfs := filepath.Join(bundle, "rootfs")
	if err := os.MkdirAll(rootfs, 0o755); err != nil {
		tb.Fatal(err)
	}
	os.MkdirAll(filepath.Join(bundle, "anchor"), 0o555)
	oci := ocispec.Build(spec, rootfs, "", benchFeatures)
	if len(s.lowers) > 0 {
		oci.Annotations[rootLowersAnnotation] = strings.Join(s.lowers, ":")
	}
	b, err := json.Marshal(oci)
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o600); err != nil {
		tb.Fatal(err)
	}
	return bundle
}

// runsc runs bin with the bench's global flags and fails on an error. Its
// output goes to a file: a detached sandbox keeps it open.
func runscCmd(tb testing.TB, bin, root string, args ...string) string {
	tb.Helper()
	out, err := os.CreateTemp(tb.TempDir(), "out")
	if err != nil {
		tb.Fatal(err)
	}
	defer out.Close()
	cmd := exec.Command(bin, append(globalArgs(tb, root), args...)...)
	cmd.Stdout, cmd.Stderr = out, out
	err = cmd.Run()
	b, _ := os.ReadFile(out.Name())
	if err != nil {
		tb.Fatalf("runsc %v: %v\n%s", args, err, b)
	}
	return string(b)
}

// sandboxPID is the sandbox process of container id.
func sandboxPID(tb testing.TB, bin, root, id string) int {
	tb.Helper()
	var st struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal([]byte(runscCmd(tb, bin, root, "state", id)), &st); err != nil || st.Pid == 0 {
		tb.Fatalf("runsc state %s: pid %d, %v", id, st.Pid, err)
	}
	return st.Pid
}

// The script that checks a layered root: every layer's file is there, the
// top layer's /etc/layer wins, and a write lands in the write layer.
const layersScript = `cat /etc/base-only /etc/layer; for f in /task/*; do cat $f; done; echo written > /task/new; cat /task/new`

func TestRootLowerImages(t *testing.T) {
	bin := layersRunsc(t)
	root := t.TempDir()
	for _, s := range stacks(t) {
		t.Run(s.name, func(t *testing.T) {
			id := "lt" + strings.ReplaceAll(s.name, "-", "")
			bundle := layeredBundle(t, id, s, []string{"/bin/sleep", "1000"})
			runscCmd(t, bin, root, "run", "--detach", "--bundle", bundle, id)
			defer exec.Command(bin, append(globalArgs(t, root), "delete", "--force", id)...).Run()
			want := runscCmd(t, bin, root, "exec", id, "/bin/sh", "-c", layersScript)
			if !strings.Contains(want, "from the base\nlayer 7\n") || !strings.Contains(want, "layer 1\n") || !strings.HasSuffix(want, "written\n") {
				t.Fatalf("sandbox on %s sees:\n%s\nwant the base's file, the top layer's /etc/layer, every layer's file, its own write", s.name, want)
			}
			// Checkpoint and restore into a new container: the same view,
			// the write included, on the same images.
			img := t.TempDir()
			runscCmd(t, bin, root, "checkpoint", "--image-path", img, id)
			runscCmd(t, bin, root, "delete", "--force", id)
			rid := id + "r"
			rbundle := layeredBundle(t, rid, s, []string{"/bin/sleep", "1000"})
			runscCmd(t, bin, root, "restore", "--detach", "--image-path", img, "--bundle", rbundle, rid)
			defer exec.Command(bin, append(globalArgs(t, root), "delete", "--force", rid)...).Run()
			got := runscCmd(t, bin, root, "exec", rid, "/bin/cat", "/etc/layer", "/task/new", "/etc/base-only")
			if got != "layer 7\nwritten\nfrom the base\n" {
				t.Errorf("restored sandbox on %s reads %q, want the top layer's file, its write and the base's", s.name, got)
			}
		})
	}
}

// BenchmarkRootLayers compares a sandbox on one image with the same
// content as two and eight stacked images (patch 0008), with
// AGENTENV_LAYERS_RUNSC or the installed runsc: per run, the CPU time of
// every process and the wall time of `runsc run /bin/true` (create, start,
// the command, destroy) and of a restore; and the PSS of idle sandboxes.
// The stacks take turns, so all see the same host load:
//
//	AGENTENV_LAYERS_RUNSC=PATH go test -run '^$' -bench RootLayers -benchtime 20x ./internal/runscbuild
//
// AGENTENV_LAYERS_BASE (a root tree, see stacks) and AGENTENV_LAYERS_CMD
// (the command run-true runs, space-separated) measure a larger base.
func BenchmarkRootLayers(b *testing.B) {
	bin := layersRunsc(b)
	all := stacks(b)
	acct := newCPUAcct(b)
	turn := func(i int) []stack { // each goes first in turn
		k := i % len(all)
		return append(slices.Clone(all[k:]), all[:k]...)
	}

	// The command run-true runs (AGENTENV_LAYERS_CMD, space-separated).
	runArgs := []string{"/bin/true"}
	if c := os.Getenv("AGENTENV_LAYERS_CMD"); c != "" {
		runArgs = strings.Fields(c)
	}
	b.Run("run-true", func(b *testing.B) {
		root := b.TempDir()
		cpu, wall := map[string][]time.Duration{}, map[string][]time.Duration{}
		for i := 0; i < b.N; i++ {
			for _, s := range turn(i) {
				id := fmt.Sprintf("lr%d%s", i, strings.ReplaceAll(s.name, "-", ""))
				bundle := layeredBundle(b, id, s, runArgs)
				c, w := acct.run(b, true, bin, append(globalArgs(b, root), "run", "--bundle", bundle, id)...)
				cpu[s.name], wall[s.name] = append(cpu[s.name], c), append(wall[s.name], w)
			}
		}
		reportStacks(b, cpu, wall)
	})

	b.Run("restore", func(b *testing.B) {
		root := b.TempDir()
		images := map[string]string{}
		for _, s := range all {
			id := "lk" + strings.ReplaceAll(s.name, "-", "")
			runscCmd(b, bin, root, "run", "--detach", "--bundle", layeredBundle(b, id, s, []string{"/bin/sleep", "1000"}), id)
			images[s.name] = b.TempDir()
			runscCmd(b, bin, root, "checkpoint", "--image-path", images[s.name], id)
			runscCmd(b, bin, root, "delete", "--force", id)
		}
		cpu, wall := map[string][]time.Duration{}, map[string][]time.Duration{}
		for i := 0; i < b.N; i++ {
			for _, s := range turn(i) {
				id := fmt.Sprintf("ls%d%s", i, strings.ReplaceAll(s.name, "-", ""))
				bundle := layeredBundle(b, id, s, []string{"/bin/sleep", "1000"})
				c, w := acct.run(b, false, bin, append(globalArgs(b, root), "restore", "--detach", "--image-path", images[s.name], "--bundle", bundle, id)...)
				cpu[s.name], wall[s.name] = append(cpu[s.name], c), append(wall[s.name], w)
				runscCmd(b, bin, root, "delete", "--force", id)
			}
		}
		reportStacks(b, cpu, wall)
	})

	b.Run("pss", func(b *testing.B) {
		const n = 8 // idle sandboxes per stack
		root := b.TempDir()
		pss := map[string][]int64{}
		for i := 0; i < min(b.N, 3); i++ { // rounds of 8 sandboxes per stack
			var ids []string
			pids := map[string][]int{}
			for k := range n {
				for _, s := range turn(k) {
					id := fmt.Sprintf("lp%d%d%s", i, k, strings.ReplaceAll(s.name, "-", ""))
					runscCmd(b, bin, root, "run", "--detach", "--bundle", layeredBundle(b, id, s, []string{"/bin/sleep", "1000"}), id)
					runscCmd(b, bin, root, "exec", id, "/bin/sh", "-c", layersScript)
					ids = append(ids, id)
					pids[s.name] = append(pids[s.name], sandboxPID(b, bin, root, id))
				}
			}
			for name, ps := range pids {
				var sum int64
				for _, pid := range ps {
					sum += pssKiB(b, pid)
				}
				pss[name] = append(pss[name], sum/int64(len(ps)))
			}
			for _, id := range ids {
				runscCmd(b, bin, root, "delete", "--force", id)
			}
		}
		for _, name := range slices.Sorted(maps.Keys(pss)) {
			v := slices.Clone(pss[name])
			slices.Sort(v)
			b.ReportMetric(float64(v[len(v)/2])/1024, "pss-MiB-"+name)
			b.Logf("%s: PSS per idle sandbox p50 %.2f MiB (%d sandboxes, %d rounds)", name, float64(v[len(v)/2])/1024, n, len(v))
		}
	})
}

// pssKiB is the proportional set size of process pid.
func pssKiB(tb testing.TB, pid int) int64 {
	tb.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		tb.Fatal(err)
	}
	for _, l := range bytes.Split(raw, []byte("\n")) {
		if v, ok := bytes.CutPrefix(l, []byte("Pss:")); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(string(v)), " kB"), 10, 64)
			if err != nil {
				tb.Fatal(err)
			}
			return kb
		}
	}
	tb.Fatalf("no Pss in /proc/%d/smaps_rollup", pid)
	return 0
}

// reportStacks reports the medians of cpu and wall per stack, and the
// median of the paired differences from the one image (run i of each
// taken back to back), which the host's load drifts least.
func reportStacks(b *testing.B, cpu, wall map[string][]time.Duration) {
	b.Helper()
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	for _, name := range slices.Sorted(maps.Keys(cpu)) {
		c, w := median(cpu[name]), median(wall[name])
		b.ReportMetric(ms(c), "cpu-ms-p50-"+name)
		b.ReportMetric(ms(w), "wall-ms-p50-"+name)
		line := fmt.Sprintf("%s: %d runs, CPU p50 %.1f ms, wall p50 %.1f ms", name, len(cpu[name]), ms(c), ms(w))
		if name != "1-image" {
			dc, dw := make([]time.Duration, len(cpu[name])), make([]time.Duration, len(wall[name]))
			for i := range dc {
				dc[i], dw[i] = cpu[name][i]-cpu["1-image"][i], wall[name][i]-wall["1-image"][i]
			}
			line += fmt.Sprintf("; minus one image, paired: CPU p50 %+.1f ms, wall p50 %+.1f ms", ms(median(dc)), ms(median(dw)))
		}
		b.Log(line)
	}
}
