package runscbuild

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/testenv"
)

// TestPatchedCheckpointRestore checks patches 0003 to 0006 (patches/gvisor)
// on the installed runsc, through the CLI with debug logs:
//   - 0006: GOGC is put back to the default after the start (a second
//     after the kernel has started), after a create and after a restore;
//   - 0005: the sandbox process forks its /proc umounter (no second runsc),
//     and it did its work: the sandbox started (the sentry checks that
//     /proc is gone before it installs its seccomp filters) and its
//     restore too;
//   - 0004: a sandbox no longer registers seccheck's points at start, yet a
//     trace session can still be created in it (that is when the points are
//     registered now), and listed;
//   - 0003: a checkpoint and a restore run their pages-file I/O with
//     GOMAXPROCS raised by at most max(8, NumCPU), not by 128, and the
//     restored sandbox runs.
func TestPatchedCheckpointRestore(t *testing.T) {
	runsc := testenv.NeedRunsc(t)
	testenv.NeedCommand(t, "mkfs.erofs", "EROFS root images (package erofs-utils)")
	s := startSandbox(t, runsc, busyboxImage(t))
	root := filepath.Join(filepath.Dir(filepath.Clean(s.logDir)), "root")
	global := globalArgs(t, root)
	// run is for calls that start no sandbox process (they would keep the
	// output pipe open).
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(runsc, append(global, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("runsc %v: %v\n%s", args, err, out)
		}
		return string(out)
	}

	boot := readLog(t, s.logDir, "boot.txt")
	if regexp.MustCompile(`seccheck initialized`).MatchString(boot) {
		t.Errorf("the sandbox registered seccheck's points at start (patch 0004 missing: run `make setup`)")
	}
	if !regexp.MustCompile(`proc umounter forked \(PID \d+\)`).MatchString(boot) {
		t.Errorf("the sandbox did not fork its /proc umounter (patch 0005 missing: run `make setup`)")
	}
	gcBack := regexp.MustCompile(`GOGC back to 100 after the start`)
	if !logSays(t, s.logDir, "boot.txt", gcBack) {
		t.Errorf("the sandbox did not put GOGC back after its start (patch 0006 missing: run `make setup`)")
	}
	conf := filepath.Join(t.TempDir(), "trace.json")
	if err := os.WriteFile(conf, []byte(`{"trace_session": {"name": "Default",
		"points": [{"name": "syscall/openat/enter"}], "sinks": []}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	run("trace", "create", "--config", conf, s.id)
	if out := run("trace", "list", s.id); !regexp.MustCompile(`Default`).MatchString(out) {
		t.Errorf("runsc trace list after create: %q, want the session Default", out)
	}

	img := filepath.Join(t.TempDir(), "image")
	run("checkpoint", "--leave-running", "--image-path", img, s.id)
	if _, err := os.Stat(filepath.Join(img, "pages.img")); err != nil {
		t.Fatalf("the checkpoint has no pages file (%v): nothing to check", err)
	}
	restored := s.id + "r"
	restoreLogs := filepath.Join(t.TempDir(), "logs") + "/"
	t.Cleanup(func() { exec.Command(runsc, "--root", root, "delete", "--force", restored).Run() })
	bundle := filepath.Join(filepath.Dir(filepath.Clean(s.logDir)), "bundle")
	// The sandbox inherits the CLI's stdio: a file, never a pipe we wait on.
	console, err := os.Create(filepath.Join(t.TempDir(), "console.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer console.Close()
	cmd := exec.Command(runsc, append(append(global, "--debug", "--debug-log", restoreLogs),
		"restore", "--detach", "--bundle", bundle, "--image-path", img, restored)...)
	cmd.Stdout, cmd.Stderr = console, console
	if err := cmd.Run(); err != nil {
		out, _ := os.ReadFile(console.Name())
		t.Fatalf("runsc restore: %v\n%s", err, out)
	}
	run("exec", restored, "/bin/true")

	restoreBoot := readLog(t, restoreLogs, "boot.txt")
	if !regexp.MustCompile(`proc umounter forked`).MatchString(restoreBoot) {
		t.Errorf("the restored sandbox did not fork its /proc umounter (patch 0005 missing)")
	}
	if !logSays(t, restoreLogs, "boot.txt", gcBack) {
		t.Errorf("the restored sandbox did not put GOGC back after the restore (patch 0006 missing)")
	}
	// Ten seconds after its kernel started, a sandbox that still runs
	// returns the start's pages (patch 0006).
	if !logSays(t, restoreLogs, "boot.txt", regexp.MustCompile(`the start's garbage collected and its pages returned`)) {
		t.Errorf("the restored sandbox did not return its start's pages (patch 0006, which returns them, missing: run `make setup`)")
	}

	limit := runtime.NumCPU() + max(8, runtime.NumCPU())
	for _, l := range []struct{ what, dir string }{{"checkpoint", s.logDir}, {"restore", restoreLogs}} {
		most := 0
		for _, m := range regexp.MustCompile(`Setting GOMAXPROCS to (\d+)`).FindAllStringSubmatch(readLog(t, l.dir, "boot.txt"), -1) {
			n, _ := strconv.Atoi(m[1])
			most = max(most, n)
		}
		t.Logf("%s: GOMAXPROCS at most %d (limit %d)", l.what, most, limit)
		if most > limit {
			t.Errorf("during the %s the sandbox ran with GOMAXPROCS %d, want at most %d (patch 0003 missing: run `make setup`)", l.what, most, limit)
		}
	}
}

// logSays waits up to 30 s for the debug log to have a line matching re
// (0006 logs a second after the start, in its own time).
func logSays(t *testing.T, dir, suffix string, re *regexp.Regexp) bool {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if re.MatchString(readLog(t, dir, suffix)) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}
