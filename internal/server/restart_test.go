package server_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/client"
	"github.com/agentenv/agentenv/internal/testenv"
)

// process is `agentenv serve` run as a separate process, so that it can be
// killed with SIGKILL. api and proxy are the addresses of its current
// start (on port 0: each start gets new ones).
type process struct {
	bin, dataDir, api, proxy string
	cmd                      *exec.Cmd
}

func (p *process) start(t *testing.T) *client.Client {
	t.Helper()
	log, err := os.OpenFile(filepath.Join(p.dataDir, "serve.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	from, err := log.Seek(0, io.SeekEnd)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command(p.bin, "serve", "--data-dir", p.dataDir, "--listen", "127.0.0.1:0", "--proxy-listen", "127.0.0.1:0",
		"--network-cidr", "10.121.0.0/20", "--network-tag", "rst",
		// Its sandboxes' layers (10 GiB each) are counted, whatever the
		// free disk of the host running the test.
		"--disk-budget", "1T")
	p.cmd.Env = append(os.Environ(), "AGENTENV_API_KEY="+testKey)
	p.cmd.Stdout, p.cmd.Stderr = log, log
	// If the test binary dies (timeout), the server goes with it.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.api, p.proxy = testenv.ServeAddrs(t, log.Name(), from, 60*time.Second)
	c := client.New("http://"+p.api, "http://"+p.proxy, testKey)
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := c.ListTemplates(context.Background()); err == nil {
			return c
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(filepath.Join(p.dataDir, "serve.log"))
			t.Fatalf("server did not come up within 60s; log:\n%s", b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (p *process) kill9(t *testing.T) {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGKILL)
	p.cmd.Wait()
}

func (p *process) stop(t *testing.T) {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		p.kill9(t)
		t.Error("server did not stop within 30s of SIGTERM")
	}
}

func (p *process) containers(t *testing.T) []string {
	out, err := exec.Command("runsc", "--root", filepath.Join(p.dataDir, "runsc"), "list", "--quiet").Output()
	if err != nil {
		t.Fatalf("runsc list: %v", err)
	}
	ids := strings.Fields(string(out))
	sort.Strings(ids)
	return ids
}

const netnsDir = "/run/agentenv/netns"

func TestRestartAfterSIGKILL(t *testing.T) {
	testenv.NeedRunsc(t)
	dir := t.TempDir()
	p := &process{bin: testenv.BuildAgentenv(t, t.TempDir()), dataDir: dir}
	// A data dir made beforehand with a lax mode (as `make demo` used to)
	// is made root-only by the server (it holds keys and tokens).
	os.Chmod(dir, 0o755)
	c := p.start(t)
	ctx := context.Background()
	for _, d := range []string{dir, filepath.Join(dir, "templates")} {
		if st, err := os.Stat(d); err != nil || st.Mode().Perm() != 0o700 {
			t.Errorf("%s: got mode %v (%v), want 0700", d, st.Mode().Perm(), err)
		}
	}
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			if sbs, err := c.ListSandboxes(ctx, nil); err == nil {
				for _, sb := range sbs {
					c.KillSandbox(ctx, sb.SandboxID)
				}
			}
			p.stop(t)
		}
		if err := testenv.DropFirewall("rst"); err != nil {
			t.Log(err)
		}
	})

	keep, err := c.CreateSandbox(ctx, client.CreateRequest{TemplateID: "busybox", Timeout: new(int64(600))})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := c.Exec(ctx, keep, "/bin/sh", []string{"-c", "echo state > /tmp/state; sleep 1000 >/dev/null 2>&1 &"}, nil, nil); err != nil || res.ExitCode != 0 {
		t.Fatalf("prepare: %v %v", res, err)
	}
	snap, err := c.SnapshotSandbox(ctx, keep.SandboxID, "before-crash", nil)
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	filesOnly := pausedWithoutMemory(t, c, "http://"+p.api)
	// Paused with its memory: the container stays frozen across the crash.
	frozen, err := c.CreateSandbox(ctx, client.CreateRequest{TemplateID: "busybox", Timeout: new(int64(600))})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := c.Exec(ctx, frozen, "/bin/sh", []string{"-c", "echo in-memory > /dev/shm/x; sleep 1000 >/dev/null 2>&1 &"}, nil, nil); err != nil || res.ExitCode != 0 {
		t.Fatalf("prepare the paused sandbox: %v %v", res, err)
	}
	if err := c.PauseSandbox(ctx, frozen.SandboxID); err != nil {
		t.Fatalf("pause: %v", err)
	}
	doomed, err := c.CreateSandbox(ctx, client.CreateRequest{TemplateID: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	// Creates in flight when the server dies.
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.CreateSandbox(ctx, client.CreateRequest{TemplateID: "busybox"})
		}()
	}
	time.Sleep(150 * time.Millisecond)
	p.kill9(t)
	wg.Wait()

	// While the server is down, one sandbox dies, and a namespace appears
	// that no sandbox owns.
	if out, err := exec.Command("runsc", "--root", filepath.Join(dir, "runsc"), "delete", "--force", doomed.SandboxID).CombinedOutput(); err != nil {
		t.Fatalf("delete doomed container: %v: %s", err, out)
	}
	strayNS := filepath.Join(netnsDir, "agentenv-rst-77")
	if err := os.WriteFile(strayNS, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("unshare", "--net="+strayNS, "true").CombinedOutput(); err != nil {
		t.Fatalf("make a stray namespace: %v: %s", err, out)
	}

	c = p.start(t)
	got, err := c.GetSandbox(ctx, keep.SandboxID)
	if err != nil {
		t.Fatalf("sandbox running before SIGKILL is not listed after restart: %v", err)
	}
	if got.State != "running" {
		t.Errorf("state after restart = %q, want running", got.State)
	}
	res, err := c.Exec(ctx, got, "/bin/sh", []string{"-c", "cat /tmp/state; ps | grep -q \"[s]leep 1000\" && echo sleeping"}, nil, nil)
	if err != nil {
		t.Fatalf("exec after restart: %v", err)
	}
	if string(res.Stdout) != "state\nsleeping\n" {
		t.Errorf("after restart: stdout %q, want the file and the background process of before", res.Stdout)
	}
	if _, err := c.GetSandbox(ctx, doomed.SandboxID); !isStatus(err, 404) || !strings.Contains(err.Error(), "lost") {
		t.Errorf("sandbox whose container died while the server was down: %v; want 404 saying it was lost", err)
	}
	if _, err := os.Stat(strayNS); err == nil {
		t.Error("a network namespace that no sandbox owns survived the restart")
	}

	resumedWithFiles(t, c, "http://"+p.api, filesOnly)
	if got, err := c.GetSandbox(ctx, frozen.SandboxID); err != nil || got.State != "paused" {
		t.Fatalf("sandbox paused with memory before SIGKILL: after restart got %+v %v, want it paused", got.State, err)
	}
	resumed, err := c.ResumeSandbox(ctx, frozen.SandboxID)
	if err != nil {
		t.Fatalf("resume after restart: %v", err)
	}
	if res, err := c.Exec(ctx, resumed, "/bin/sh", []string{"-c", "cat /dev/shm/x; ps | grep -c '[s]leep 1000'"}, nil, nil); err != nil || string(res.Stdout) != "in-memory\n1\n" {
		t.Errorf("paused sandbox after restart and resume: stdout %q (%v), want its memory (/dev/shm and the process) back", res.Stdout, err)
	}

	// Snapshots survive the crash and still restore.
	fromSnap, err := c.CreateSandbox(ctx, client.CreateRequest{TemplateID: snap.SnapshotID})
	if err != nil {
		t.Fatalf("restore a snapshot taken before the crash: %v", err)
	}
	if res, err := c.Exec(ctx, fromSnap, "/bin/sh", []string{"-c", "cat /tmp/state"}, nil, nil); err != nil || string(res.Stdout) != "state\n" {
		t.Errorf("sandbox restored after the crash: %q, %v", res.Stdout, err)
	}

	// Whatever the interrupted creates left is either a listed, working
	// sandbox or gone entirely.
	listed, err := c.ListSandboxes(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, sb := range listed {
		ids = append(ids, sb.SandboxID)
		if sb, err = c.GetSandbox(ctx, sb.SandboxID); err != nil {
			t.Fatal(err)
		}
		if r, err := c.Exec(ctx, sb, "/bin/true", nil, nil, nil); err != nil || r.ExitCode != 0 {
			t.Errorf("listed sandbox %s does not work after restart: %v", sb.SandboxID, err)
		}
	}
	sort.Strings(ids)
	// Warm containers (made ahead for restores of this template, each
	// marked in its directory) are the server's, not sandboxes.
	var running []string
	warm := 0
	for _, id := range p.containers(t) {
		if _, err := os.Stat(filepath.Join(p.dataDir, "sandboxes", id, "warm")); err == nil {
			warm++
			continue
		}
		running = append(running, id)
	}
	if fmt.Sprint(running) != fmt.Sprint(ids) {
		t.Errorf("runsc containers %v (besides %d warm), want exactly the listed sandboxes %v", running, warm, ids)
	}
	// Besides the sandboxes' own, the server keeps up to 8 (--slot-pool)
	// slots ready, one per warm container, and one for a warm container
	// being made (refills run one at a time).
	if ns := namespaces("rst"); len(ns) < len(ids) || len(ns) > len(ids)+8+warm+1 {
		t.Errorf("%d network namespaces for %d sandboxes, %d warm containers and a pool of 8: %v", len(ns), len(ids), warm, ns)
	}

	for _, id := range ids {
		if err := c.KillSandbox(ctx, id); err != nil {
			t.Errorf("kill %s: %v", id, err)
		}
	}
	p.stop(t)
	if got := p.containers(t); len(got) > 0 {
		t.Errorf("containers left after killing everything: %v", got)
	}
	if ns := namespaces("rst"); len(ns) > 0 {
		t.Errorf("namespaces left after killing everything: %v", ns)
	}
	if st := hostNetworkState(t, "rst"); st != "namespaces=[] links=[] slot-rules=[]" {
		t.Errorf("network left after killing everything: %s", st)
	}
	entries, _ := os.ReadDir(filepath.Join(dir, "sandboxes"))
	for _, e := range entries {
		if e.Name() != "lost" {
			t.Errorf("sandbox directory left: %s", e.Name())
		}
	}
	if t.Failed() {
		b, _ := os.ReadFile(filepath.Join(dir, "serve.log"))
		t.Logf("server log:\n%s", b)
	}
}
