package server_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/client"
)

func TestHostIsInvisible(t *testing.T) {
	e := sharedServer(t)
	sb := e.create(t, client.CreateRequest{})
	hostname, _ := os.Hostname()
	res := e.sh(t, sb, `cat /proc/1/cmdline | tr '\0' ' '; echo; ls /proc | grep -c '^[0-9]'; hostname; ls /work /root/go 2>&1 | head -2`)
	lines := strings.Split(string(res.Stdout), "\n")
	if !strings.Contains(lines[0], "envd") {
		t.Errorf("PID 1 in the sandbox is %q, want envd (the host's processes must be invisible)", lines[0])
	}
	if n := strings.TrimSpace(lines[1]); n == "" || len(n) > 2 {
		t.Errorf("the sandbox sees %s processes; want only its own few", n)
	}
	if len(lines) > 2 && lines[2] == hostname {
		t.Errorf("the sandbox has the host's hostname %q", hostname)
	}
	if strings.Contains(string(res.Stdout), "main") || strings.Contains(string(res.Stdout), "pkg") {
		t.Errorf("host directories are visible in the sandbox: %q", res.Stdout)
	}
}

// TestResourceExhaustionIsContained runs a fork bomb and a memory hog in two
// sandboxes and checks that a third sandbox and the server stay responsive.
func TestResourceExhaustionIsContained(t *testing.T) {
	e := sharedServer(t)
	ctx := context.Background()
	bystander := e.create(t, client.CreateRequest{})
	bomb := e.create(t, client.CreateRequest{MemoryMB: 256})
	hog := e.create(t, client.CreateRequest{MemoryMB: 128})
	// The memory hog must be torn down by the server with a reason.
	defer func() {
		_, err := e.client.GetSandbox(ctx, hog.SandboxID)
		if !isStatus(err, 404) || !strings.Contains(err.Error(), "stopped unexpectedly") {
			t.Errorf("after its memory hog, get sandbox: %v; want 404 saying it stopped unexpectedly", err)
		}
	}()

	bombDone := make(chan client.ExecResult, 1)
	go func() {
		// The bomb ends itself after a few seconds; forks beyond the
		// process limit fail with EAGAIN inside the sandbox.
		c, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		res, _ := e.client.Exec(c, bomb, "/bin/sh", []string{"-c", `f(){ f | f & }; (f) >/dev/null 2>&1 </dev/null; sleep 4; echo bomb-survived`}, nil, nil)
		bombDone <- res
	}()
	hogDone := make(chan error, 1)
	go func() {
		c, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		// 1 GiB buffer in a 128 MiB sandbox.
		_, err := e.client.Exec(c, hog, "/bin/sh", []string{"-c", `dd if=/dev/zero of=/dev/null bs=1024M count=1; dd if=/dev/zero of=/tmp/fill bs=1M count=1024`}, nil, nil)
		hogDone <- err
	}()

	time.Sleep(time.Second)
	for i := range 3 {
		start := time.Now()
		res := e.sh(t, bystander, "echo alive")
		if string(res.Stdout) != "alive\n" {
			t.Fatalf("bystander sandbox, round %d: stdout %q", i, res.Stdout)
		}
		if _, err := e.client.ListSandboxes(ctx, nil); err != nil {
			t.Fatalf("server unresponsive during the attack: %v", err)
		}
		t.Logf("round %d: bystander exec + list took %v", i, time.Since(start))
		time.Sleep(500 * time.Millisecond)
	}
	// The hog's sandbox is killed by its memory limit (the whole gVisor
	// kernel goes): the server notices, tears it down and says why.
	select {
	case err := <-hogDone:
		t.Logf("memory hog exec ended: %v", err)
	case <-time.After(30 * time.Second):
		t.Error("the memory hog's exec did not end within 30s")
	}
	<-bombDone
	// The attackers can be killed cleanly, or were already torn down by
	// the server, which then says why.
	for _, sb := range []client.Sandbox{bomb, hog} {
		err := e.client.KillSandbox(ctx, sb.SandboxID)
		if err != nil && !(isStatus(err, 404) && strings.Contains(err.Error(), "stopped unexpectedly")) {
			t.Errorf("kill %s: %v", sb.SandboxID, err)
		}
		t.Logf("sandbox %s: kill: %v", sb.SandboxID, err)
		if left := e.leftovers(sb, ""); len(left) > 0 {
			t.Errorf("sandbox %s left behind: %v", sb.SandboxID, left)
		}
	}
}
