package goclient_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/client"
	"github.com/agentenv/agentenv/internal/testenv"
)

// TestAgainstServer runs the flows of the package's examples against a
// real `agentenv serve` (built from this tree, with its own data dir,
// ports and network range): the client's methods and the server's
// answers, end to end through the proxy and envd.
func TestAgainstServer(t *testing.T) {
	testenv.NeedRunsc(t)
	c := startServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sb, err := c.CreateSandbox(ctx, client.CreateRequest{TemplateID: "busybox", Timeout: new(int64(300)),
		Metadata: map[string]string{"test": "goclient"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		run  func(*testing.T, context.Context, *client.Client, client.Sandbox)
	}{
		{"sandboxes", testSandboxes},
		{"commands", testCommands},
		{"files", testFiles},
		{"pty", testPTY},
		{"snapshot-fork", testSnapshotFork},
		{"pause-connect", testPauseConnect}, // last: it pauses sb
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, ctx, c, sb) })
	}
	if err := c.KillSandbox(ctx, sb.SandboxID); err != nil {
		t.Fatal(err)
	}
	var ae *client.Error
	if _, err := c.GetSandbox(ctx, sb.SandboxID); !errors.As(err, &ae) || ae.Status != http.StatusNotFound {
		t.Errorf("get after kill: %v, want a 404 *Error", err)
	}
}

// Get, list by metadata, set the timeout, read metrics.
func testSandboxes(t *testing.T, ctx context.Context, c *client.Client, sb client.Sandbox) {
	got, err := c.GetSandbox(ctx, sb.SandboxID)
	if err != nil || got.State != "running" || got.TemplateID != "busybox" || got.EnvdAccessToken == "" {
		t.Errorf("get: %+v, %v; want running busybox with its envd token", got, err)
	}
	list, err := c.ListSandboxes(ctx, map[string]string{"test": "goclient"})
	if err != nil || !slices.ContainsFunc(list, func(s client.Sandbox) bool { return s.SandboxID == sb.SandboxID }) {
		t.Errorf("list by metadata: %d sandboxes, %v; want %s among them", len(list), err, sb.SandboxID)
	}
	if err := c.SetTimeout(ctx, sb.SandboxID, 600); err != nil {
		t.Error(err)
	}
	if got, err := c.GetSandbox(ctx, sb.SandboxID); err != nil || time.Until(got.EndAt) < 500*time.Second {
		t.Errorf("after SetTimeout(600): ends at %v (%v), want about 10 minutes from now", got.EndAt, err)
	}
	if err := c.RefreshSandbox(ctx, sb.SandboxID, 60); err != nil {
		t.Error(err)
	}
}

// Output streams while the command runs; exit codes and stdin come back.
func testCommands(t *testing.T, ctx context.Context, c *client.Client, sb client.Sandbox) {
	var out bytes.Buffer
	res, err := c.Exec(ctx, sb, "/bin/sh", []string{"-c", "echo out; echo err >&2; exit 3"}, &out, nil)
	if err != nil || res.ExitCode != 3 || out.String() != "out\n" || string(res.Stderr) != "err\n" {
		t.Errorf("exec: exit %d, streamed %q, stderr %q, %v; want 3, out, err", res.ExitCode, out.String(), res.Stderr, err)
	}
	p, err := c.StartProcess(ctx, sb, client.ProcessRequest{Cmd: "cat", Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.CopyStdin(ctx, strings.NewReader("piped")); err != nil {
		t.Error(err)
	}
	if res, err := p.Wait(nil, nil); err != nil || string(res.Stdout) != "piped" {
		t.Errorf("cat of stdin: %q, %v", res.Stdout, err)
	}
	p, err = c.StartProcess(ctx, sb, client.ProcessRequest{Cmd: "sleep", Args: []string{"100"}})
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	procs, err := c.ListProcesses(ctx, sb)
	if err != nil || !slices.ContainsFunc(procs, func(pi client.ProcessInfo) bool { return pi.PID == p.PID }) {
		t.Errorf("processes: %+v, %v; want pid %d", procs, err, p.PID)
	}
	q, err := c.ConnectProcess(ctx, sb, p.PID, "")
	if err != nil {
		t.Fatal(err)
	}
	q.Kill(ctx)
	if res, err := q.Wait(nil, nil); err != nil || res.ExitCode != -1 {
		t.Errorf("attached and killed: exit %d, %v; want -1", res.ExitCode, err)
	}
}

// Write, read, list, rename, remove, copy a tree out and back.
func testFiles(t *testing.T, ctx context.Context, c *client.Client, sb client.Sandbox) {
	fs := c.Files(sb, "")
	if err := fs.Write(ctx, "/tmp/gc/a.txt", strings.NewReader("alpha")); err != nil {
		t.Fatal(err)
	}
	if b, err := c.ReadFile(ctx, sb, "/tmp/gc/a.txt"); err != nil || string(b) != "alpha" {
		t.Errorf("read back: %q, %v", b, err)
	}
	if _, err := fs.Rename(ctx, "/tmp/gc/a.txt", "/tmp/gc/b.txt"); err != nil {
		t.Error(err)
	}
	entries, err := fs.List(ctx, "/tmp/gc")
	if err != nil || len(entries) != 1 || entries[0].Name != "b.txt" || entries[0].Size != 5 {
		t.Errorf("list after rename: %+v, %v; want b.txt of 5 bytes", entries, err)
	}
	local := t.TempDir()
	if err := fs.CopyFrom(ctx, "/tmp/gc", filepath.Join(local, "gc"), func(string) {}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(local, "gc", "b.txt")); err != nil || string(b) != "alpha" {
		t.Errorf("copied out: %q, %v", b, err)
	}
	if err := fs.Remove(ctx, "/tmp/gc"); err != nil {
		t.Error(err)
	}
	if _, err := fs.Stat(ctx, "/tmp/gc"); err == nil {
		t.Error("stat after remove: no error")
	}
}

// A terminal runs what is typed and reports the shell's exit code.
func testPTY(t *testing.T, ctx context.Context, c *client.Client, sb client.Sandbox) {
	p, err := c.StartPTY(ctx, sb, client.PTYRequest{Cmd: "/bin/sh", Cols: 100, Rows: 30})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Resize(ctx, 120, 40); err != nil {
		t.Error(err)
	}
	if err := p.Write(ctx, []byte("stty size; exit 7\n")); err != nil {
		t.Fatal(err)
	}
	var screen bytes.Buffer
	code, err := p.Output(&screen)
	if err != nil || code != 7 || !strings.Contains(screen.String(), "40 120") {
		t.Errorf("pty: exit %d, %v, screen %q; want 7 and the size 40 120", code, err, screen.String())
	}
}

// A snapshot restores the sandbox's files; a fork's children continue it.
func testSnapshotFork(t *testing.T, ctx context.Context, c *client.Client, sb client.Sandbox) {
	if err := c.WriteFile(ctx, sb, "/tmp/state", strings.NewReader("step 1")); err != nil {
		t.Fatal(err)
	}
	sn, err := c.SnapshotSandbox(ctx, sb.SandboxID, "goclient-snap", map[string]string{"k": "v"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.DeleteSnapshot(ctx, sn.SnapshotID)
	if got, err := c.GetSnapshot(ctx, sn.SnapshotID); err != nil || got.Name != "goclient-snap" || got.SandboxID != sb.SandboxID {
		t.Errorf("get snapshot: %+v, %v", got, err)
	}
	restored, err := c.CreateSandbox(ctx, client.CreateRequest{TemplateID: sn.SnapshotID, Timeout: new(int64(120))})
	if err != nil {
		t.Fatal(err)
	}
	defer c.KillSandbox(ctx, restored.SandboxID)
	if b, err := c.ReadFile(ctx, restored, "/tmp/state"); err != nil || string(b) != "step 1" || restored.SnapshotID != sn.SnapshotID {
		t.Errorf("restored: file %q, %v, snapshot %q; want step 1 from %s", b, err, restored.SnapshotID, sn.SnapshotID)
	}
	children, errs, err := c.ForkSandbox(ctx, sb.SandboxID, 2)
	if err != nil {
		t.Fatal(err)
	}
	for i, child := range children {
		if errs[i] != nil {
			t.Errorf("child %d: %v", i, errs[i])
			continue
		}
		defer c.KillSandbox(ctx, child.SandboxID)
		if b, err := c.ReadFile(ctx, child, "/tmp/state"); err != nil || string(b) != "step 1" || child.ParentSandboxID != sb.SandboxID {
			t.Errorf("child %d: file %q, %v, parent %q", i, b, err, child.ParentSandboxID)
		}
	}
}

// A paused sandbox's envd calls say it is paused; connect resumes it.
func testPauseConnect(t *testing.T, ctx context.Context, c *client.Client, sb client.Sandbox) {
	if err := c.PauseSandbox(ctx, sb.SandboxID); err != nil {
		t.Fatal(err)
	}
	var nr *client.NotRunningError
	if _, err := c.Exec(ctx, sb, "true", nil, nil, nil); !errors.As(err, &nr) || nr.State != "paused" {
		t.Errorf("exec while paused: %v, want a NotRunningError saying paused", err)
	}
	got, err := c.ConnectSandbox(ctx, sb.SandboxID, client.ConnectRequest{Timeout: new(int64(120))})
	if err != nil || got.State != "running" {
		t.Fatalf("connect: %+v, %v; want running", got, err)
	}
	if res, err := c.Exec(ctx, got, "cat", []string{"/tmp/state"}, nil, nil); err != nil || string(res.Stdout) != "step 1" {
		t.Errorf("after connect: %q, %v", res.Stdout, err)
	}
}

// startServer starts `agentenv serve` and stops it when the test ends (its
// log kept if the test failed); it returns a client of it once the busybox
// template is built.
func startServer(t *testing.T) *client.Client {
	const key = "goclient-test-key"
	bin := testenv.BuildAgentenv(t, t.TempDir())
	dir, err := os.MkdirTemp("", "agentenv-goclient-test-")
	if err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(dir, "serve.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	cmd := exec.Command(bin, "serve", "--data-dir", dir, "--listen", "127.0.0.1:0", "--proxy-listen", "127.0.0.1:0",
		"--network-cidr", "10.126.0.0/20", "--network-tag", "gc")
	cmd.Env = append(os.Environ(), "AGENTENV_API_KEY="+key)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // dies with the test binary
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var c *client.Client
	t.Cleanup(func() {
		ctx := context.Background()
		if c != nil { // nil: it never served
			if sbs, err := c.ListSandboxes(ctx, nil); err == nil {
				for _, sb := range sbs {
					c.KillSandbox(ctx, sb.SandboxID)
				}
			}
		}
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("agentenv serve log kept in %s/serve.log", dir)
			return
		}
		os.RemoveAll(dir)
	})
	api, proxy := testenv.ServeAddrs(t, log.Name(), 0, 3*time.Minute)
	c = client.New("http://"+api, "http://"+proxy, key)
	deadline := time.Now().Add(3 * time.Minute)
	for {
		if tpl, err := c.GetTemplate(context.Background(), "busybox"); err == nil && tpl.TemplateID == "busybox" {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("no busybox template on the server after 3 minutes (log: %s/serve.log)", dir)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
