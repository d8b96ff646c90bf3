package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/client"
	"github.com/agentenv/agentenv/internal/server"
	"github.com/agentenv/agentenv/internal/testenv"
)

// outcomeSeries are the series of agentenv_exec_results_total and
// agentenv_sandbox_ends_total whose run label (the tests' servers'
// --metrics-label-key) is run, as "exec ok", "end killed", ..., with the
// count of a kill refused as not found.
func (e *env) outcomeSeries(t *testing.T, run string) map[string]float64 {
	t.Helper()
	req, _ := http.NewRequest("GET", e.api+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+operatorKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics with the operator key: HTTP %d, %v", resp.StatusCode, err)
	}
	out := map[string]float64{}
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSpace(line)
		var kind, class string
		switch {
		case strings.HasPrefix(line, "agentenv_exec_results_total{result="):
			kind = "exec"
		case strings.HasPrefix(line, "agentenv_sandbox_ends_total{cause="):
			kind = "end"
		case strings.HasPrefix(line, `agentenv_operation_errors_total{cause="not_found",op="kill"`):
			v, _ := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			out["kill not_found"] = v
			continue
		default:
			continue
		}
		if !strings.Contains(line, `,run="`+run+`"}`) {
			continue
		}
		class, _, _ = strings.Cut(line[strings.IndexByte(line, '"')+1:], `"`)
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("/metrics line %q: %v", line, err)
		}
		out[kind+" "+class] = v
	}
	return out
}

// waitOutcomes polls /metrics until run's series are want (a command is
// counted when its proxied stream ends, just after the client has read
// its end), and fails with what they are after 30 s.
func (e *env) waitOutcomes(t *testing.T, step, run string, want map[string]float64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := e.outcomeSeries(t, run)
		delete(got, "kill not_found")
		if fmt.Sprint(got) == fmt.Sprint(want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: got series %v, want %v", step, got, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestMetricsCountOutcomes drives real sandboxes labelled with a run
// through every way a command and a sandbox end, and checks that
// /metrics (scraped with the operator key) counts each exactly once in
// its class, under the run's label: commands that exit 0 and non-zero,
// run past their timeout and are killed out of memory by envd's guard;
// sandboxes killed, timed out, killed by the host's memory cgroup and
// lost (their processes killed from outside). A kill of a sandbox that
// does not exist is not counted as a failed kill.
func TestMetricsCountOutcomes(t *testing.T) {
	e := sharedServer(t)
	ctx := context.Background()
	run := fmt.Sprintf("outcomes-%d", time.Now().UnixNano())
	md := map[string]string{"run": run}
	want := map[string]float64{}
	check := func(step string) { t.Helper(); e.waitOutcomes(t, step, run, want) }

	sb := e.create(t, client.CreateRequest{MemoryMB: 512, Metadata: md})
	e.sh(t, sb, "true")
	want["exec ok"]++
	check("an exec that exits 0")

	if res, err := e.client.Exec(ctx, sb, "/bin/sh", []string{"-c", "exit 3"}, nil, nil); err != nil || res.ExitCode != 3 {
		t.Fatalf("exec of exit 3: got exit code %d, %v", res.ExitCode, err)
	}
	want["exec nonzero"]++
	check("an exec that exits 3")

	p, err := e.client.StartProcess(ctx, sb, client.ProcessRequest{Cmd: "/bin/sleep", Args: []string{"100"}, Timeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Wait(nil, nil); !errors.Is(err, client.ErrProcessTimeout) {
		t.Fatalf("sleep 100 with a 500 ms timeout: got %v, want ErrProcessTimeout", err)
	}
	want["exec timeout"]++
	check("an exec past its timeout")

	hog, err := os.Open(memhogBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	defer hog.Close()
	if err := e.client.WriteFile(ctx, sb, "/tmp/memhog", hog); err != nil {
		t.Fatalf("upload memhog: %v", err)
	}
	e.sh(t, sb, "chmod +x /tmp/memhog")
	want["exec ok"]++
	c, cancel := context.WithTimeout(ctx, 60*time.Second)
	res, err := e.client.Exec(c, sb, "/tmp/memhog", []string{"1536"}, nil, nil)
	cancel()
	if res.ExitCode != 137 || !errors.Is(err, client.ErrOutOfMemory) || client.Cause(err) != client.CauseOOM {
		t.Fatalf("allocating 1.5 GiB in 512 MiB: got exit code %d, %v (cause %q); want 137 and client.ErrOutOfMemory", res.ExitCode, err, client.Cause(err))
	}
	want["exec oom"]++
	check("an exec killed out of memory")

	before := e.outcomeSeries(t, run)["kill not_found"]
	if err := e.client.KillSandbox(ctx, sb.SandboxID); err != nil {
		t.Fatal(err)
	}
	want["end killed"]++
	check("a kill")
	e.wantEndCause(t, sb.SandboxID, "killed")
	if err := e.client.KillSandbox(ctx, sb.SandboxID); !isStatus(err, 404) {
		t.Fatalf("second kill: got %v, want 404", err)
	}
	if err := e.client.KillSandbox(ctx, "no-such-sandbox-0123456789"); !isStatus(err, 404) {
		t.Fatalf("kill of an unknown sandbox: got %v, want 404", err)
	}
	if got := e.outcomeSeries(t, run)["kill not_found"]; got != before {
		t.Errorf("kills of sandboxes that are gone: kill not_found errors went from %v to %v, want no change", before, got)
	}
	check("kills of sandboxes that are gone")

	short := e.create(t, client.CreateRequest{Timeout: new(int64(1)), Metadata: md})
	want["end timeout"]++
	check("a sandbox's timeout")
	e.wantEndCause(t, short.SandboxID, "timeout")

	full := e.create(t, client.CreateRequest{MemoryMB: 512, Metadata: md})
	oomKill(t, e, full, "/dev/shm/fill")
	want["end oom"]++
	check("a sandbox killed by the host's memory cgroup")
	if _, err := e.client.GetSandbox(ctx, full.SandboxID); err == nil || !strings.Contains(err.Error(), "ran out of its memory limit (512 MiB)") {
		t.Errorf("get after the OOM: %v, want it to say it ran out of its memory limit (512 MiB)", err)
	}
	e.wantEndCause(t, full.SandboxID, "oom")

	lost := e.create(t, client.CreateRequest{Metadata: md})
	if n := killProcessesOf(t, lost.SandboxID); n == 0 {
		t.Fatalf("no host process names sandbox %s", lost.SandboxID)
	}
	want["end lost"]++
	check("a sandbox whose processes were killed from outside")
	e.wantEndCause(t, lost.SandboxID, "lost")
}

// wantEndCause checks that GET /sandboxes/{id} answers 404 with end_cause
// cause in its body.
func (e *env) wantEndCause(t *testing.T, id, cause string) {
	t.Helper()
	_, err := e.client.GetSandbox(context.Background(), id)
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Status != 404 || ce.EndCause != cause {
		t.Errorf("get of sandbox %s that ended: got %v (end cause %q), want 404 with end_cause %q", id, err, endCauseOf(ce), cause)
	}
}

func endCauseOf(ce *client.Error) string {
	if ce == nil {
		return ""
	}
	return ce.EndCause
}

// killProcessesOf SIGKILLs the host processes whose command line names
// sandbox id (its gVisor sandbox process) and returns how many.
func killProcessesOf(t *testing.T, id string) int {
	t.Helper()
	n := 0
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(b), id) {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if err == nil && syscall.Kill(pid, syscall.SIGKILL) == nil {
			n++
		}
	}
	return n
}

// TestRunRefusesBadMetricsLabelKey: a metadata key that cannot be a
// Prometheus label (or that names one of the series' own labels) stops
// the server at start, before it touches the host, saying which flag.
func TestRunRefusesBadMetricsLabelKey(t *testing.T) {
	testenv.NeedRoot(t)
	for _, l := range []server.MetricsLabel{{Key: "run-id"}, {Key: "result"}, {Key: "run", Values: -1}} {
		err := server.Run(context.Background(), server.Config{DataDir: t.TempDir(), Metrics: l, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}, nil)
		if err == nil || !strings.Contains(err.Error(), "--metrics-label-") {
			t.Errorf("serve with %+v: got %v, want an error naming the --metrics-label- flag", l, err)
		}
	}
}
