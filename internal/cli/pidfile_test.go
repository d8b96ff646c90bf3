package cli

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fakeServeEnv makes the test binary, re-executed, wait for SIGTERM and
// exit 0: a process with any command line, for isServe and --stop.
const fakeServeEnv = "AGENTENV_TEST_FAKE_PROCESS"

func TestMain(m *testing.M) {
	if os.Getenv(fakeServeEnv) != "" {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM)
		os.Stdout.WriteString("ready\n")
		<-sig
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// startFake starts a process whose command line is argv0 args... and that
// exits 0 on SIGTERM.
func startFake(t *testing.T, argv0 string, args ...string) *exec.Cmd {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := &exec.Cmd{Path: self, Args: append([]string{argv0}, args...), Env: append(os.Environ(), fakeServeEnv+"=1")}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	// It says ready once SIGTERM no longer kills it outright.
	if line, err := bufio.NewReader(stdout).ReadString('\n'); line != "ready\n" {
		t.Fatalf("fake process: got %q, %v; want ready", line, err)
	}
	return cmd
}

func cmdline(pid int) string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	return strings.ReplaceAll(string(b), "\x00", " ")
}

func writePid(t *testing.T, dir string, pid int) {
	t.Helper()
	if err := os.WriteFile(pidFilePath(dir), []byte(strconv.Itoa(pid)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestServeStopSignalsOnlyTheRecordedServer: --stop stops the process
// the pid file names when it is an agentenv serve, waits for its exit, and
// never signals anything else a stale pid file may name.
func TestServeStopSignalsOnlyTheRecordedServer(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer

	if err := stopServer(&out, dir, time.Second); err == nil || !strings.Contains(err.Error(), "no agentenv serve is recorded") {
		t.Errorf("stop without a pid file: got %v, want an error saying none is recorded", err)
	}

	// A stale file naming some other process: it is left alone.
	other := startFake(t, "sleeper", "serve-not")
	writePid(t, dir, other.Process.Pid)
	if err := stopServer(&out, dir, time.Second); err != nil {
		t.Fatalf("stop with a stale pid file: %v", err)
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(other.Process.Pid)); err != nil {
		t.Errorf("the process a stale pid file named was stopped (%s)", cmdline(other.Process.Pid))
	}
	if _, err := os.Stat(pidFilePath(dir)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale pid file not removed: %v", err)
	}

	// A (fake) agentenv serve: stopped, and --stop returns after it exited.
	srv := startFake(t, "/usr/local/bin/agentenv", "--data-dir", dir, "serve")
	if !isServe(srv.Process.Pid) {
		t.Fatalf("isServe(%q) = false, want true", cmdline(srv.Process.Pid))
	}
	writePid(t, dir, srv.Process.Pid)
	exited := make(chan error, 1)
	go func() { exited <- srv.Wait() }()
	if err := stopServer(&out, dir, 10*time.Second); err != nil {
		t.Fatalf("stop: %v", err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("server exited with %v, want 0 (SIGTERM)", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("stopServer returned but the server is still running")
	}
	if !strings.Contains(out.String(), "stopped") {
		t.Errorf("got output %q, want it to say the server stopped", out.String())
	}
}

// TestServePidFile: a second serve on the same data dir is refused while
// the first runs; release removes only a file that names this process.
func TestServePidFile(t *testing.T) {
	dir := t.TempDir()
	srv := startFake(t, "agentenv", "serve")
	writePid(t, dir, srv.Process.Pid)
	if _, err := claimPidFile(dir); err == nil || !strings.Contains(err.Error(), "already runs") {
		t.Errorf("claim while a server runs: got %v, want a refusal", err)
	}
	// A worker of the same binary is not a server.
	worker := startFake(t, "agentenv", "__gvisor-worker", "serve")
	if isServe(worker.Process.Pid) {
		t.Errorf("isServe(%q) = true for a gVisor worker", cmdline(worker.Process.Pid))
	}
	writePid(t, dir, worker.Process.Pid)
	release, err := claimPidFile(dir)
	if err != nil {
		t.Fatalf("claim over a stale file: %v", err)
	}
	if pid, _ := readPid(pidFilePath(dir)); pid != os.Getpid() {
		t.Errorf("pid file holds %d, want %d", pid, os.Getpid())
	}
	release()
	if _, err := os.Stat(pidFilePath(dir)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("release left the pid file: %v", err)
	}
	writePid(t, dir, srv.Process.Pid)
	release() // the file now names another process: kept
	if _, err := os.Stat(pidFilePath(dir)); err != nil {
		t.Errorf("release removed a pid file naming another process: %v", err)
	}
}
