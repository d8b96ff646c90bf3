package server_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/client"
)

// TestOOMKilledSandboxLeavesNothing fills a 512 MiB sandbox's memory (2 GiB
// written into /dev/shm; files elsewhere go to the disk layer) until the
// host's memory cgroup kills the whole sandbox, and checks that the server
// tears it down with a reason and that nothing of it stays on the host, its
// cgroups under every controller included.
func TestOOMKilledSandboxLeavesNothing(t *testing.T) {
	e := sharedServer(t)
	for _, tc := range []struct {
		name, target string
		cpus         int
		straggler    bool
	}{
		// The default limits: handed out from the hot pool.
		{name: "shm", target: "/dev/shm/fill"},
		// Other limits: restored from the ready snapshot into a new container.
		{name: "shm-restored", target: "/dev/shm/fill", cpus: 1},
		// A host process sits in the sandbox's cpu, cpuset, pids and memory
		// cgroups when it dies, so that the first removal of its cgroups
		// fails (busy): the teardown must retry until they are gone.
		{name: "straggler-in-cgroups", target: "/dev/shm/fill", straggler: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sb := e.create(t, client.CreateRequest{MemoryMB: 512, CPUCount: tc.cpus})
			if tc.straggler {
				joinCgroups(t, sb.SandboxID, "cpu", "cpuset", "pids", "memory")
			}
			oomKill(t, e, sb, tc.target)
			deadline := time.Now().Add(30 * time.Second)
			for {
				left := e.leftovers(sb, "")
				if len(left) == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("OOM-killed sandbox %s left behind after 30s: %v", sb.SandboxID, left)
				}
			}
		})
	}
}

// oomKill writes 2 GiB into target inside sb and waits until the server
// has noticed the sandbox's death and says why.
func oomKill(t *testing.T, e *env, sb client.Sandbox, target string) {
	t.Helper()
	ctx := context.Background()
	c, cancel := context.WithTimeout(ctx, 60*time.Second)
	_, err := e.client.Exec(c, sb, "/bin/sh", []string{"-c", "dd if=/dev/zero of=" + target + " bs=1M count=2048"}, nil, nil)
	cancel()
	t.Logf("exec of the memory filler ended: %v", err)
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := e.client.GetSandbox(ctx, sb.SandboxID)
		if isStatus(err, 404) {
			if !strings.Contains(err.Error(), "stopped unexpectedly") {
				t.Errorf("get after the OOM kill: %v; want 404 saying it stopped unexpectedly", err)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s still listed 30s after filling 2 GiB into 512 MiB (get: %v)", sb.SandboxID, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// joinCgroups starts a host process in the sandbox's cgroups of the given
// (cgroup v1) controllers; it is killed when the test ends, if the
// server's cleanup has not killed it before.
func joinCgroups(t *testing.T, id string, controllers ...string) {
	t.Helper()
	if _, err := os.Stat(filepath.Join("/sys/fs/cgroup/memory/agentenv", id)); err != nil {
		t.Skipf("no cgroup v1 memory cgroup for %s: %v", id, err)
	}
	cmd := exec.Command("sleep", "120")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-done })
	for _, c := range controllers {
		p := filepath.Join("/sys/fs/cgroup", c, "agentenv", id, "cgroup.procs")
		if err := os.WriteFile(p, []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
			t.Fatalf("move a process into %s: %v", p, err)
		}
	}
}
