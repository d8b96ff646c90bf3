package imagebuild_test

import (
	"bufio"
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/internal/imagebuild"
)

// withLimits replaces e's builder by one whose build sandboxes get limits.
func (e *env) withLimits(l imagebuild.Limits) {
	e.t.Helper()
	cfg := e.cfg
	cfg.Limits = l
	e.reopen(cfg)
}

// reopen replaces e's builder by a new one over the same cache (as a
// restarted server makes).
func (e *env) reopen(cfg imagebuild.Config) {
	e.t.Helper()
	b, err := imagebuild.New(cfg)
	if err != nil {
		e.t.Fatalf("New: %v", err)
	}
	e.b, e.cfg = b, cfg
}

// hostMemTotalKiB is the host's MemTotal.
func hostMemTotalKiB(t *testing.T) int64 {
	t.Helper()
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) >= 2 && f[0] == "MemTotal:" {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n
		}
	}
	t.Fatal("no MemTotal in /proc/meminfo")
	return 0
}

// A build that asks for no CPU or memory still runs in a sandbox bounded
// by the server's defaults: it sees its own memory, not the host's, and
// cannot raise its process cap.
func TestBuildSandboxDefaultLimits(t *testing.T) {
	e := newEnv(t, true)
	e.withLimits(imagebuild.Limits{CPUs: 1, MemoryMB: 512, Pids: 64})
	spec := imagebuild.Spec{Name: "limits", FromImage: e.ref, Steps: []imagebuild.Step{
		{Type: "RUN", Args: []string{"grep MemTotal /proc/meminfo > /memtotal; ulimit -Hu > /nproc; " +
			"if (ulimit -u unlimited) 2>/dev/null; then echo raised; else echo refused; fi > /raise", "root"}},
	}}
	req, lines, err := e.prepare(context.Background(), spec)
	if err != nil {
		t.Fatalf("Prepare: %v\nlog:\n%s", err, strings.Join(lines, "\n"))
	}
	f := strings.Fields(readTree(t, req.Tree, "memtotal"))
	if len(f) < 2 {
		t.Fatalf("/memtotal = %q", f)
	}
	got, _ := strconv.ParseInt(f[1], 10, 64)
	if host := hostMemTotalKiB(t); got > 512<<10 || got >= host {
		t.Errorf("MemTotal in the build sandbox = %d KiB, want at most the 512 MiB default (host: %d KiB)", got, host)
	}
	if got := readTree(t, req.Tree, "nproc"); got != "64" {
		t.Errorf("ulimit -Hu in the build sandbox = %q, want the default cap 64", got)
	}
	if got := readTree(t, req.Tree, "raise"); got != "refused" {
		t.Errorf("ulimit -u unlimited: %s, want refused", got)
	}
}

// Memory written to /dev/shm is the build's memory: past the limit the
// step fails, and the host is left as it was.
func TestBuildSandboxShmBounded(t *testing.T) {
	e := newEnv(t, true)
	e.withLimits(imagebuild.Limits{CPUs: 1, MemoryMB: 256, Pids: 64})
	spec := imagebuild.Spec{Name: "shm", FromImage: e.ref, Steps: []imagebuild.Step{
		{Type: "RUN", Args: []string{"dd if=/dev/zero of=/dev/shm/fill bs=1M count=1024 && echo wrote-$((6*7))", "root"}},
	}}
	_, lines, err := e.prepare(context.Background(), spec)
	var se *imagebuild.StepError
	if !errors.As(err, &se) {
		t.Fatalf("got %v, want the RUN writing 1 GiB into /dev/shm under a 256 MiB limit to fail\nlog:\n%s", err, strings.Join(lines, "\n"))
	}
	if strings.Contains(strings.Join(lines, "\n"), "wrote-42") {
		t.Errorf("dd wrote 1 GiB into /dev/shm under a 256 MiB limit")
	}
	t.Logf("the step failed: %v", se.Err)
	e.noLeftovers()
}

// A RUN that starts processes without end gets no more than the cap.
func TestBuildSandboxProcessCap(t *testing.T) {
	e := newEnv(t, true)
	e.withLimits(imagebuild.Limits{CPUs: 1, MemoryMB: 512, Pids: 64})
	// bash, refused a fork, retries it for a while and then gives up (the
	// subshell ends); what is left running is what the cap let through.
	spec := imagebuild.Spec{Name: "forks", FromImage: e.ref, Steps: []imagebuild.Step{
		{Type: "RUN", Args: []string{"ulimit -u unlimited 2>/dev/null; (for i in {1..100}; do sleep 4 & done) 2>/dev/null; " +
			"ls /proc | grep -c '^[0-9]*$' > /most; wait", "root"}},
	}}
	req, lines, err := e.prepare(context.Background(), spec)
	if err != nil {
		t.Fatalf("Prepare: %v\nlog:\n%s", err, strings.Join(lines, "\n"))
	}
	most, err := strconv.Atoi(readTree(t, req.Tree, "most"))
	if err != nil || most > 64 {
		t.Errorf("most processes seen at once = %d (%v), want at most the cap 64", most, err)
	}
	t.Logf("most processes seen at once: %d", most)
}
