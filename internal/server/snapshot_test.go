package server_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/client"
)

// startMemoryServer starts, in sb, a shell that holds a random value only
// in its memory and serves it on TCP port 9000 (loopback included), and
// writes a file. It returns the value.
func startMemoryServer(t *testing.T, e *env, sb client.Sandbox) string {
	t.Helper()
	res := e.sh(t, sb, `V=$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')
echo before-snapshot > /tmp/written-before
(while true; do echo "$V" | nc -l -p 9000; done) >/dev/null 2>&1 </dev/null &
echo "$V"`)
	v := strings.TrimSpace(string(res.Stdout))
	if len(v) != 16 {
		t.Fatalf("memory server setup printed %q", res.Stdout)
	}
	// Wait until it listens.
	if got := askMemoryServer(t, e, sb); got != v {
		t.Fatalf("memory server answers %q, want %q", got, v)
	}
	return v
}

// askMemoryServer connects to the memory server over loopback inside sb,
// for up to 30 s while it starts (a loaded host is slow to start nc).
func askMemoryServer(t *testing.T, e *env, sb client.Sandbox) string {
	t.Helper()
	res := e.sh(t, sb, `for i in $(seq 1 300); do out=$(nc 127.0.0.1 9000 </dev/null 2>/dev/null) && [ -n "$out" ] && { echo "$out"; exit 0; }; sleep 0.1; done; exit 1`)
	return strings.TrimSpace(string(res.Stdout))
}

func TestPauseResume(t *testing.T) {
	e := sharedServer(t)
	ctx := context.Background()
	sb := e.create(t, client.CreateRequest{Timeout: new(int64(60))})
	v := startMemoryServer(t, e, sb)
	before, _ := e.client.GetSandbox(ctx, sb.SandboxID)
	// The pause happens between these two instants, whatever the load.
	pauseStart := time.Now()
	if err := e.client.PauseSandbox(ctx, sb.SandboxID); err != nil {
		t.Fatalf("pause: %v", err)
	}
	pauseEnd := time.Now()
	if err := e.client.PauseSandbox(ctx, sb.SandboxID); !isStatus(err, 409) {
		t.Errorf("second pause: %v, want 409", err)
	}
	got, _ := e.client.GetSandbox(ctx, sb.SandboxID)
	if got.State != "paused" {
		t.Errorf("state = %q, want paused", got.State)
	}
	// envd of a paused sandbox answers 502 through the proxy, as E2B's
	// (the SDK reads it as "not running"; lifecycle_test checks the body).
	if _, err := e.client.Exec(ctx, sb, "/bin/true", nil, nil, nil); err == nil {
		t.Errorf("exec in a paused sandbox succeeded, want an error")
	}
	time.Sleep(1500 * time.Millisecond)
	resumeStart := time.Now()
	resumed, err := e.client.ResumeSandbox(ctx, sb.SandboxID)
	if err != nil {
		t.Fatalf("resume: %v", err)
	}
	resumeEnd := time.Now()
	// Paused time does not count: the resume gives back what was left at
	// the pause. Bounds from the instants around both calls, not a
	// tolerance: a loaded host may take seconds for either. Counting the
	// 1.5 s paused would end before the lower bound.
	leftMin, leftMax := before.EndAt.Sub(pauseEnd), before.EndAt.Sub(pauseStart)
	if lo, hi := resumeStart.Add(leftMin), resumeEnd.Add(leftMax); resumed.EndAt.Before(lo) || resumed.EndAt.After(hi) {
		t.Errorf("after 1.5s paused, ends at %v; want between %v and %v (%v to %v left at the pause, from the resume)",
			resumed.EndAt, lo, hi, leftMin.Round(time.Millisecond), leftMax.Round(time.Millisecond))
	}
	if got := askMemoryServer(t, e, sb); got != v {
		t.Errorf("after resume the memory server answers %q, want %q", got, v)
	}
}

func TestSnapshotRestoreAndFork(t *testing.T) {
	e := sharedServer(t)
	ctx := context.Background()
	parent := e.create(t, client.CreateRequest{Metadata: map[string]string{"role": "parent"}})
	v := startMemoryServer(t, e, parent)

	sn, err := e.client.SnapshotSandbox(ctx, parent.SandboxID, "continuity", map[string]string{"k": "v"})
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	if sn.TemplateID != "busybox" || sn.SizeBytes <= 0 || sn.SandboxID != parent.SandboxID {
		t.Errorf("snapshot metadata = %+v", sn)
	}
	// The parent keeps running.
	if got := askMemoryServer(t, e, parent); got != v {
		t.Errorf("parent after snapshot answers %q, want %q", got, v)
	}

	restored := e.create(t, client.CreateRequest{TemplateID: sn.SnapshotID})
	checkContinuity(t, e, restored, v)
	if err := e.client.DeleteSnapshot(ctx, sn.SnapshotID); !isStatus(err, 409) {
		t.Errorf("delete a snapshot a running sandbox uses: %v, want 409", err)
	}

	const n = 16
	start := time.Now()
	children, errs, err := e.client.ForkSandbox(ctx, parent.SandboxID, n)
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	t.Logf("fork of %d children took %v", n, time.Since(start))
	for i, c := range children {
		if errs[i] != nil {
			t.Fatalf("child %d: %v", i, errs[i])
		}
		t.Cleanup(func() { e.client.KillSandbox(context.Background(), c.SandboxID) })
	}
	var wg sync.WaitGroup
	for i, c := range children {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.Run(fmt.Sprintf("child%d", i), func(t *testing.T) { checkContinuity(t, e, c, v) })
		}()
	}
	wg.Wait()

	// Isolation: child 0 writes and deletes files and kills the memory
	// server; the parent and the other children see none of it.
	res := e.sh(t, children[0], `echo mine > /tmp/child0-only; rm /tmp/written-before; kill $(ps | grep "[n]c -l" | awk '{print $1}') $(ps | grep "[w]hile true" | awk '{print $1}') 2>/dev/null; ls /tmp`)
	if strings.Contains(string(res.Stdout), "written-before") {
		t.Fatalf("child 0 could not delete its file: %q", res.Stdout)
	}
	for i, c := range append([]client.Sandbox{parent}, children[1:]...) {
		out := e.sh(t, c, `ls /tmp`)
		if strings.Contains(string(out.Stdout), "child0-only") || !strings.Contains(string(out.Stdout), "written-before") {
			t.Errorf("sandbox %d (%s) sees child 0's changes: ls /tmp = %q", i, c.SandboxID, out.Stdout)
		}
		if got := askMemoryServer(t, e, c); got != v {
			t.Errorf("sandbox %d: memory server answers %q after child 0 killed its own, want %q", i, got, v)
		}
	}

	// Fork of a fork.
	grand, errs, err := e.client.ForkSandbox(ctx, children[1].SandboxID, 1)
	if err != nil || errs[0] != nil {
		t.Fatalf("fork of a fork: %v %v", err, errs)
	}
	t.Cleanup(func() { e.client.KillSandbox(context.Background(), grand[0].SandboxID) })
	checkContinuity(t, e, grand[0], v)
}

// checkContinuity checks a restored sandbox: the file written before the
// snapshot is there and the process started before it still answers with
// the value it held in memory.
func checkContinuity(t *testing.T, e *env, sb client.Sandbox, want string) {
	t.Helper()
	res := e.sh(t, sb, "cat /tmp/written-before")
	if string(res.Stdout) != "before-snapshot\n" {
		t.Errorf("sandbox %s: file written before the snapshot reads %q", sb.SandboxID, res.Stdout)
	}
	if got := askMemoryServer(t, e, sb); got != want {
		t.Errorf("sandbox %s: memory server answers %q, want %q", sb.SandboxID, got, want)
	}
}

func TestReadyTemplate(t *testing.T) {
	e := sharedServer(t)
	ctx := context.Background()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ts, err := e.client.ListTemplates(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ready := false
		for _, tpl := range ts {
			ready = ready || (tpl.TemplateID == "busybox" && tpl.Ready)
		}
		if ready {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("busybox template not ready within 60s of start")
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Two sandboxes from the ready snapshot: each has its own identity,
	// environment, token and filesystem.
	a := e.create(t, client.CreateRequest{EnvVars: map[string]string{"WHO": "a"}})
	b := e.create(t, client.CreateRequest{EnvVars: map[string]string{"WHO": "b"}})
	for _, c := range []struct {
		sb  client.Sandbox
		who string
	}{{a, "a"}, {b, "b"}} {
		res := e.sh(t, c.sb, `echo "$WHO $E2B_SANDBOX_ID"; id -un; ls /tmp`)
		want := fmt.Sprintf("%s %s\nuser\n", c.who, c.sb.SandboxID)
		if string(res.Stdout) != want {
			t.Errorf("sandbox %s from the ready template: %q, want %q", c.sb.SandboxID, res.Stdout, want)
		}
	}
	if a.EnvdAccessToken == b.EnvdAccessToken {
		t.Error("two sandboxes from a ready template share an access token")
	}
	e.sh(t, a, "echo x > /tmp/only-a")
	if res := e.sh(t, b, "ls /tmp"); strings.Contains(string(res.Stdout), "only-a") {
		t.Error("a write in one sandbox from a ready template shows in another")
	}
}
