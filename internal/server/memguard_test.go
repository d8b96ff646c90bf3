package server_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/client"
	"github.com/agentenv/agentenv/internal/testenv"
)

var (
	memhogOnce sync.Once
	memhogPath string
	memhogErr  error
)

// memhogBinary builds (once) the static allocator of testdata/memhog: it
// touches its pages from user space as Python's bytearray(n) does, which
// neither busybox nor the GNU template can (dd's buffer is filled inside
// one read, where a kill lands only when the read ends).
func memhogBinary(t *testing.T) string {
	t.Helper()
	memhogOnce.Do(func() {
		dir, err := os.MkdirTemp("", "agentenv-memhog-")
		if err != nil {
			memhogErr = err
			return
		}
		memhogPath = filepath.Join(dir, "memhog")
		cmd := exec.Command("go", "build", "-o", memhogPath, "./internal/server/testdata/memhog")
		cmd.Dir = testenv.RepoRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			memhogErr = err
			t.Logf("%s", b)
		}
	})
	if memhogErr != nil {
		t.Fatalf("build memhog: %v", memhogErr)
	}
	return memhogPath
}

// TestOOMEndsTheCommandNotTheSandbox allocates 1.5 GiB in a 512 MiB sandbox
// and checks that envd's memory guard kills that command before the host's
// memory cgroup kills the sandbox: the command ends with exit code 137 and
// an error naming out-of-memory, and the sandbox, a background process
// started before and a file written before all live on.
func TestOOMEndsTheCommandNotTheSandbox(t *testing.T) {
	e := sharedServer(t)
	hog := memhogBinary(t)
	for _, tc := range []struct {
		name     string
		template func() string
		cmd      string
		args     []string
	}{
		{name: "busybox", template: func() string { return "busybox" }, cmd: "/tmp/memhog", args: []string{"1536"}},
		// Through a shell, as SDKs run commands.
		{name: "gnu", template: func() string { return gnuTemplate(t, e) }, cmd: "/bin/sh", args: []string{"-c", "/tmp/memhog 1536"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			sb := e.create(t, client.CreateRequest{TemplateID: tc.template(), MemoryMB: 512})
			f, err := os.Open(hog)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if err := e.client.WriteFile(ctx, sb, "/tmp/memhog", f); err != nil {
				t.Fatalf("upload memhog: %v", err)
			}
			e.sh(t, sb, "chmod +x /tmp/memhog && echo before > /tmp/kept")
			bg, err := e.client.StartProcess(ctx, sb, client.ProcessRequest{Cmd: "/bin/sleep", Args: []string{"1000"}})
			if err != nil {
				t.Fatalf("start a background process: %v", err)
			}
			defer bg.Close()

			c, cancel := context.WithTimeout(ctx, 60*time.Second)
			res, err := e.client.Exec(c, sb, tc.cmd, tc.args, nil, nil)
			cancel()
			if res.ExitCode != 137 || err == nil || !strings.Contains(err.Error(), "out of memory") {
				t.Fatalf("allocating 1.5 GiB in 512 MiB: got exit code %d, error %v; want 137 and an error naming out of memory", res.ExitCode, err)
			}
			if got := strings.TrimSpace(string(e.sh(t, sb, "cat /tmp/kept").Stdout)); got != "before" {
				t.Errorf("file written before the OOM: got %q, want %q", got, "before")
			}
			procs, err := e.client.ListProcesses(ctx, sb)
			if err != nil {
				t.Fatalf("list processes after the OOM: %v", err)
			}
			found := false
			for _, p := range procs {
				found = found || p.PID == bg.PID
			}
			if !found {
				t.Errorf("background process %d after the OOM: got %+v, want it still running", bg.PID, procs)
			}
			// The guard is ready for the next one.
			c, cancel = context.WithTimeout(ctx, 60*time.Second)
			res, err = e.client.Exec(c, sb, "/tmp/memhog", []string{"1536"}, nil, nil)
			cancel()
			if res.ExitCode != 137 || err == nil || !strings.Contains(err.Error(), "out of memory") {
				t.Fatalf("second 1.5 GiB: got exit code %d, error %v; want 137 and an error naming out of memory", res.ExitCode, err)
			}
			if got := e.sh(t, sb, "echo alive").Stdout; string(got) != "alive\n" {
				t.Errorf("command after the second OOM: got %q, want %q", got, "alive\n")
			}
		})
	}
}
