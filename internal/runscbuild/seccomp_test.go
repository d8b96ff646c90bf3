package runscbuild

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	agentruntime "github.com/agentenv/agentenv/internal/runtime"
	"github.com/agentenv/agentenv/internal/runtime/ocispec"
	"github.com/agentenv/agentenv/internal/runtime/runscbin"
	"github.com/agentenv/agentenv/internal/testenv"
)

// StubPath is where `make setup` keeps a runsc built like the installed one
// but with the module's stub filters, so that it compiles its seccomp
// programs at every start (as a plain `go install` build does).
const StubPath = "/usr/local/lib/agentenv/runsc-stub"

// TestPrecompiledFilterIsCompiledProgram starts the same sandbox (an EROFS
// root with a write layer on disk and a gofer, agentenv's runsc flags) with
// the installed runsc and with the stub build, and compares the seccomp
// programs installed in the sentry and the gofer, read back from the kernel.
// They must be the same instructions, but for the runtime variables that
// gVisor patches into a precompiled program (the process's own PID, ...),
// which must sit exactly where the compiled program has its own values.
func TestPrecompiledFilterIsCompiledProgram(t *testing.T) {
	runsc := testenv.NeedRunsc(t)
	if _, err := os.Stat(StubPath); err != nil {
		if testenv.Required() {
			t.Fatalf("the stub runsc build is missing (%v): run `make setup`", err)
		}
		t.Skipf("skipping: no stub runsc build at %s (run `make setup`)", StubPath)
	}
	testenv.NeedCommand(t, "mkfs.erofs", "EROFS root images (package erofs-utils)")
	image := busyboxImage(t)

	pre := startSandbox(t, runsc, image)
	stub := startSandbox(t, StubPath, image)

	for _, role := range []struct {
		name string
		pid  func(*sandbox) int
		log  string // debug log file suffix of the process
	}{
		{"sentry", func(s *sandbox) int { return s.sentry }, "boot.txt"},
		{"gofer", func(s *sandbox) int { return s.gofer }, "gofer.txt"},
	} {
		t.Run(role.name, func(t *testing.T) {
			preLog := readLog(t, pre.logDir, role.log)
			stubLog := readLog(t, stub.logDir, role.log)
			key, vars := precompiledUse(t, preLog)
			if !strings.Contains(stubLog, "building seccomp program from scratch") {
				t.Fatalf("the stub build did not compile its %s filter; its log says:\n%s", role.name, grepSeccomp(stubLog))
			}
			if !strings.Contains(stubLog, key) {
				t.Errorf("the stub build's %s used other options than %s; its log says:\n%s", role.name, key, grepSeccomp(stubLog))
			}
			got := readFilters(t, role.pid(pre))
			want := readFilters(t, role.pid(stub))
			t.Logf("%s: options %s, variables %v, %d filter(s) of %v instructions", role.name, key, vars, len(got), lens(got))

			// The values the stub build compiled in: the same, but for
			// its own PID (a PID-namespace view, as the sentry sees it)
			// in the self_pid variables (gVisor's and our patch's).
			stubVars := map[string]uint32{}
			selfPID := uint64(nsPID(t, role.pid(stub)))
			for k, v := range vars {
				switch {
				case strings.HasSuffix(k, "self_pid_high32bits"):
					v = uint32(selfPID >> 32)
				case strings.HasSuffix(k, "self_pid_low32bits"):
					v = uint32(selfPID)
				}
				stubVars[k] = v
			}
			if prePID := uint64(nsPID(t, role.pid(pre))); uint64(vars["self_pid_high32bits"])<<32|uint64(vars["self_pid_low32bits"]) != prePID {
				t.Fatalf("logged self_pid %v, but the process's own PID is %d: the log parse is wrong", vars, prePID)
			}
			compareFilters(t, got, want, vars, stubVars)
		})
	}

	// The stub processes' programs (patch 0007): each sandbox's own stub
	// addresses are the variables, logged by each build.
	t.Run("stub", func(t *testing.T) {
		preLog := readLog(t, pre.logDir, "boot.txt")
		stubLog := readLog(t, stub.logDir, "boot.txt")
		vars := stubVariables(t, preLog, stubPrecompiledLine)
		wantVars := stubVariables(t, stubLog, stubCompiledLine)
		got := readFilters(t, stubTask(t, pre.sentry, len(stubProgramNames)))
		want := readFilters(t, stubTask(t, stub.sentry, len(stubProgramNames)))
		t.Logf("stub: variables %v and %v, %d filter(s) of %v instructions", vars, wantVars, len(got), lens(got))
		compareFilters(t, got, want, vars, wantVars)
	})
}

// What the patched Sentry logs for each of its stub programs (patch 0007).
var (
	stubPrecompiledLine = regexp.MustCompile(`Loaded precompiled stub seccomp program (\S+), using variables: map\[(.*)\]`)
	stubCompiledLine    = regexp.MustCompile(`Compiling stub seccomp program (\S+), variables: map\[(.*)\]`)
)

// stubProgramNames are the stub programs a Sentry makes at its start.
var stubProgramNames = []string{"systrap_stub_process", "systrap_sysmsg_thread", "systrap_sysmsg_syscall_notify"}

// stubVariables returns the variables of every stub program that log says
// was made the way line describes, and fails unless all of them were.
func stubVariables(t *testing.T, log string, line *regexp.Regexp) map[string]uint32 {
	t.Helper()
	vars := map[string]uint32{}
	seen := map[string]bool{}
	for _, m := range line.FindAllStringSubmatch(log, -1) {
		seen[m[1]] = true
		for _, kv := range strings.Fields(m[2]) {
			k, v, ok := strings.Cut(kv, ":")
			n, err := strconv.ParseUint(v, 10, 32)
			if !ok || err != nil {
				t.Fatalf("cannot parse variable %q in %q", kv, m[0])
			}
			if old, dup := vars[k]; dup && old != uint32(n) {
				t.Fatalf("variable %s is %d in one stub program and %d in another", k, old, n)
			}
			vars[k] = uint32(n)
		}
	}
	for _, name := range stubProgramNames {
		if !seen[name] {
			t.Fatalf("no %q line for stub program %s; the log says:\n%s", line, name, grepSeccomp(log))
		}
	}
	return vars
}

// stubTask returns the thread, among the processes the sentry started (its
// systrap stubs), with the most seccomp filters: one that runs application
// code has all the stub programs. It waits (up to 10 s) for one with want.
func stubTask(t *testing.T, sentry, want int) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		tid, n := mostFiltered(t, sentry)
		if n >= want || time.Now().After(deadline) {
			if tid == 0 {
				t.Fatalf("sandbox process %d has no stub process with a seccomp filter", sentry)
			}
			return tid
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// mostFiltered returns the stub thread of sentry with the most seccomp
// filters, and how many it has.
func mostFiltered(t *testing.T, sentry int) (int, int) {
	t.Helper()
	children := map[int][]int{}
	for _, pid := range procPIDs(t) {
		if ppid, ok := statusField(fmt.Sprintf("/proc/%d/status", pid), "PPid:"); ok {
			children[ppid] = append(children[ppid], pid)
		}
	}
	best, most := 0, 0
	queue := append([]int(nil), children[sentry]...)
	for len(queue) > 0 {
		pid := queue[0]
		queue = append(queue[1:], children[pid]...)
		tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		for _, task := range tasks {
			tid, err := strconv.Atoi(task.Name())
			if err != nil {
				continue
			}
			if n, ok := statusField(fmt.Sprintf("/proc/%d/task/%d/status", pid, tid), "Seccomp_filters:"); ok && (n > most || n == most && tid < best) {
				best, most = tid, n
			}
		}
	}
	return best, most
}

// procPIDs lists the host's processes.
func procPIDs(t *testing.T) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// statusField returns the number after name in a /proc status file.
func statusField(path, name string) (int, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == name {
			n, err := strconv.Atoi(f[1])
			return n, err == nil
		}
	}
	return 0, false
}

// compareFilters checks that got (precompiled, rendered with vars) and want
// (compiled with wantVars) are the same programs: equal instructions except
// for constants, and a constant that differs must be the same variable's
// value in each.
func compareFilters(t *testing.T, got, want [][]unix.SockFilter, vars, wantVars map[string]uint32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d filters installed, the stub build installed %d", len(got), len(want))
	}
	for f := range got {
		g, w := got[f], want[f]
		if len(g) != len(w) {
			t.Errorf("filter %d: %d instructions, the stub build's has %d", f, len(g), len(w))
			continue
		}
		patched := 0
		for i := range g {
			if g[i] == w[i] {
				continue
			}
			name := ""
			for k, v := range vars {
				if g[i].K == v && w[i].K == wantVars[k] {
					name = k
				}
			}
			if g[i].Code != w[i].Code || g[i].Jt != w[i].Jt || g[i].Jf != w[i].Jf || name == "" {
				t.Errorf("filter %d instruction %d: got %+v, the stub build's is %+v (not a variable's value)", f, i, g[i], w[i])
				continue
			}
			patched++
		}
		t.Logf("filter %d: %d instructions equal, %d differ only by a variable's value", f, len(g)-patched, patched)
	}
}

type sandbox struct {
	id            string
	logDir        string
	sentry, gofer int
}

// startSandbox runs `sleep` in a new sandbox with agentenv's spec and
// global flags (network none; agentenv's netns sandboxes use the same
// filter options), with debug logs, and returns its processes.
func startSandbox(t *testing.T, runsc, image string) *sandbox {
	t.Helper()
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	s := &sandbox{id: fmt.Sprintf("seccomp%d", time.Now().UnixNano()), logDir: filepath.Join(dir, "logs") + "/"}
	spec := agentruntime.Spec{ID: s.id, Dir: dir, Image: image, DiskMB: 64,
		Args: []string{"/bin/sleep", "1000"}, Env: []string{"PATH=/bin"}}
	// No runsc features: the anchor is a bind mount, so a gofer runs and
	// its filter is compared too (volumes bring gofers back).
	bundle, err := ocispec.WriteBundle(spec, "", runscbin.Features{})
	if err != nil {
		t.Fatal(err)
	}
	global := append(globalArgs(t, root), "--debug", "--debug-log", s.logDir)
	console, err := os.Create(filepath.Join(dir, "console.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer console.Close()
	cmd := exec.Command(runsc, append(global, "run", "--detach", "--bundle", bundle, s.id)...)
	cmd.Stdout, cmd.Stderr = console, console
	t.Cleanup(func() {
		exec.Command(runsc, "--root", root, "delete", "--force", s.id).Run()
	})
	if err := cmd.Run(); err != nil {
		out, _ := os.ReadFile(console.Name())
		t.Fatalf("%s run: %v\n%s", runsc, err, out)
	}
	s.sentry, s.gofer = processesOf(t, s.id)
	return s
}

// globalArgs are agentenv's runsc flags (internal/runtime/gvisor) for a
// sandbox without network and cgroups, with state in root.
func globalArgs(tb testing.TB, root string) []string {
	tb.Helper()
	if err := runscbin.MkSharedRoot(); err != nil {
		tb.Fatal(err)
	}
	return []string{"--root", root, "--shared-root", runscbin.SharedRoot, "--platform", "systrap",
		"--network", "none", "--allow-suid", "--ignore-cgroups"}
}

// processesOf finds the sandbox and gofer processes of container id by
// their names (runsc renames them) and command lines.
func processesOf(t *testing.T, id string) (sentry, gofer int) {
	t.Helper()
	for _, pid := range procPIDs(t) {
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		args := strings.Split(string(bytes.TrimRight(cmdline, "\x00")), "\x00")
		if args[len(args)-1] != id {
			continue
		}
		switch filepath.Base(args[0]) {
		case "runsc-sandbox":
			sentry = pid
		case "runsc-gofer":
			gofer = pid
		}
	}
	if sentry == 0 || gofer == 0 {
		t.Fatalf("sandbox %s: sentry PID %d, gofer PID %d: want both", id, sentry, gofer)
	}
	return sentry, gofer
}

// readFilters returns the seccomp filters of process pid, the most recently
// installed first, read with PTRACE_SECCOMP_GET_FILTER.
func readFilters(t *testing.T, pid int) [][]unix.SockFilter {
	t.Helper()
	runtime.LockOSThread() // ptrace requests must come from the tracing thread
	defer runtime.UnlockOSThread()
	if err := unix.PtraceSeize(pid); err != nil {
		t.Fatalf("PTRACE_SEIZE %d: %v", pid, err)
	}
	defer unix.PtraceDetach(pid)
	if err := unix.PtraceInterrupt(pid); err != nil {
		t.Fatalf("PTRACE_INTERRUPT %d: %v", pid, err)
	}
	var ws unix.WaitStatus
	if _, err := unix.Wait4(pid, &ws, unix.WALL, nil); err != nil {
		t.Fatalf("wait for %d to stop: %v", pid, err)
	}
	var filters [][]unix.SockFilter
	for i := 0; ; i++ {
		n, _, errno := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_SECCOMP_GET_FILTER, uintptr(pid), uintptr(i), 0, 0, 0)
		if errno == unix.ENOENT {
			break
		}
		if errno != 0 {
			t.Fatalf("PTRACE_SECCOMP_GET_FILTER %d #%d: %v", pid, i, errno)
		}
		prog := make([]unix.SockFilter, n)
		if _, _, errno := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_SECCOMP_GET_FILTER, uintptr(pid), uintptr(i), uintptr(unsafe.Pointer(&prog[0])), 0, 0); errno != 0 {
			t.Fatalf("PTRACE_SECCOMP_GET_FILTER %d #%d: %v", pid, i, errno)
		}
		filters = append(filters, prog)
	}
	if len(filters) == 0 {
		t.Fatalf("process %d has no seccomp filter", pid)
	}
	return filters
}

// nsPID is process pid's PID in its own PID namespace (the last NSpid).
func nsPID(t *testing.T, pid int) int {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(status), "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[0] == "NSpid:" {
			n, err := strconv.Atoi(f[len(f)-1])
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("/proc/%d/status has no NSpid", pid)
	return 0
}

// readLog returns the debug log whose name ends in suffix in dir.
func readLog(t *testing.T, dir, suffix string) string {
	t.Helper()
	matches, err := filepath.Glob(filepath.Join(dir, "*"+suffix))
	if err != nil || len(matches) != 1 {
		all, _ := filepath.Glob(filepath.Join(dir, "*"))
		t.Fatalf("want one *%s debug log in %s, have %v", suffix, dir, all)
	}
	b, err := os.ReadFile(matches[0])
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// precompiledLine is what gVisor logs when it installs a precompiled filter.
var precompiledLine = regexp.MustCompile(`Loaded precompiled seccomp instructions for options (.*), using variables: map\[(.*)\]`)

// precompiledUse returns the options key and variables of the precompiled
// filter a debug log says was installed, and fails if none was.
func precompiledUse(t *testing.T, log string) (string, map[string]uint32) {
	t.Helper()
	m := precompiledLine.FindStringSubmatch(log)
	if m == nil {
		t.Fatalf("the installed runsc did not use a precompiled filter; its log says:\n%s", grepSeccomp(log))
	}
	vars := map[string]uint32{}
	for _, kv := range strings.Fields(m[2]) {
		k, v, ok := strings.Cut(kv, ":")
		n, err := strconv.ParseUint(v, 10, 32)
		if !ok || err != nil {
			t.Fatalf("cannot parse variable %q in %q", kv, m[0])
		}
		vars[k] = uint32(n)
	}
	return m[1], vars
}

func grepSeccomp(log string) string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(strings.ToLower(l), "seccomp") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func lens(fs [][]unix.SockFilter) []int {
	n := make([]int, len(fs))
	for i, f := range fs {
		n[i] = len(f)
	}
	return n
}

// busyboxImage makes an EROFS image of a busybox root with sleep and true.
func busyboxImage(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	rootfs := filepath.Join(dir, "rootfs")
	for _, d := range []string{"bin", "proc", "dev", "sys", "tmp", "etc"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatalf("static busybox (package busybox-static): %v", err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "bin", "busybox"), bb, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, applet := range []string{"sleep", "true"} {
		if err := os.Symlink("busybox", filepath.Join(rootfs, "bin", applet)); err != nil {
			t.Fatal(err)
		}
	}
	image := filepath.Join(dir, "rootfs.erofs")
	// gVisor cannot map tail-packed data (docs/traps.md).
	if out, err := exec.Command("mkfs.erofs", "-E", "noinline_data", image, rootfs).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.erofs: %v\n%s", err, out)
	}
	return image
}
