package server_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/client"
)

// scrapeMetrics reads the server's /metrics as series → value.
func (e *env) scrapeMetrics(t *testing.T) map[string]float64 {
	t.Helper()
	req, _ := http.NewRequest("GET", e.api+"/metrics", nil)
	req.Header.Set("X-API-Key", e.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: HTTP %d, %v", resp.StatusCode, err)
	}
	out := map[string]float64{}
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("/metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

func sandboxSeries(state, template string) string {
	return fmt.Sprintf(`agentenv_sandboxes{role="serve",state=%q,template=%q}`, state, template)
}

// TestGaugesFollowSandboxes scrapes a real server's /metrics while real
// sandboxes are created, paused, snapshotted, killed and reaped by their
// timeout: each gauge moves with them.
func TestGaugesFollowSandboxes(t *testing.T) {
	e := sharedServer(t)
	ctx := context.Background()
	running, paused := sandboxSeries("running", "busybox"), sandboxSeries("paused", "busybox")
	before := e.scrapeMetrics(t)
	check := func(step string, want map[string]float64) {
		t.Helper()
		got := e.scrapeMetrics(t)
		for series, w := range want {
			if g := got[series]; g != w {
				t.Errorf("after %s: %s = %v, want %v", step, series, g, w)
			}
		}
	}

	a := e.create(t, client.CreateRequest{})
	b := e.create(t, client.CreateRequest{})
	check("2 creates", map[string]float64{running: before[running] + 2, paused: before[paused]})

	// Execs through the proxy: counted when they end, never left in
	// flight (the SDK leaves a stream once its end event arrives, which
	// aborts the proxy's copy of the trailer).
	execs := `agentenv_operation_duration_seconds_count{op="exec",role="serve"}`
	for range 6 {
		e.sh(t, b, "echo hi")
	}
	deadline := time.Now().Add(30 * time.Second)
	for m := e.scrapeMetrics(t); m[execs] < before[execs]+6 || m[`agentenv_operations_in_flight{op="exec",role="serve"}`] != 0; m = e.scrapeMetrics(t) {
		if time.Now().After(deadline) {
			t.Fatalf("30 s after 6 execs: %v counted (want %v), %v in flight (want 0)", m[execs], before[execs]+6, m[`agentenv_operations_in_flight{op="exec",role="serve"}`])
		}
		time.Sleep(50 * time.Millisecond)
	}

	if err := e.client.PauseSandbox(ctx, a.SandboxID); err != nil {
		t.Fatal(err)
	}
	check("a pause", map[string]float64{running: before[running] + 1, paused: before[paused] + 1})

	if _, err := e.client.SnapshotSandbox(ctx, b.SandboxID, "", nil); err != nil {
		t.Fatal(err)
	}
	if got := e.scrapeMetrics(t)[`agentenv_snapshot_store_bytes{role="serve"}`]; got <= before[`agentenv_snapshot_store_bytes{role="serve"}`] {
		t.Errorf("snapshot store: %v bytes after a snapshot, want more than %v", got, before[`agentenv_snapshot_store_bytes{role="serve"}`])
	}

	for _, sb := range []client.Sandbox{a, b} {
		if err := e.client.KillSandbox(ctx, sb.SandboxID); err != nil {
			t.Fatal(err)
		}
	}
	check("2 kills", map[string]float64{running: before[running], paused: before[paused]})

	// The pools: the shared server keeps warm containers and a hot pool of
	// busybox (WarmPool 2, HotPool 2), refilled in the background.
	got := e.scrapeMetrics(t)
	for _, series := range []string{
		`agentenv_pool_sandboxes{pool="warm",role="serve",template="busybox"}`,
		`agentenv_pool_sandboxes{pool="hot",role="serve",template="busybox"}`,
		`agentenv_host_cpus{role="serve"}`, `agentenv_host_memory_available_bytes{role="serve"}`,
	} {
		if _, ok := got[series]; !ok {
			t.Errorf("%s: absent from /metrics", series)
		}
	}
	// Both refill to something (the shared server asks for 2 of each).
	for _, series := range []string{
		`agentenv_pool_sandboxes{pool="warm",role="serve",template="busybox"}`,
		`agentenv_pool_sandboxes{pool="hot",role="serve",template="busybox"}`,
	} {
		deadline := time.Now().Add(30 * time.Second)
		for e.scrapeMetrics(t)[series] < 1 {
			if time.Now().After(deadline) {
				t.Errorf("%s: still 0 after 30 s, want the pool refilled", series)
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	if g := got[`agentenv_operation_duration_seconds_count{op="create",role="serve"}`]; g < before[`agentenv_operation_duration_seconds_count{op="create",role="serve"}`]+2 {
		t.Errorf("create operations: got %v, want at least 2 more than %v", g, before[`agentenv_operation_duration_seconds_count{op="create",role="serve"}`])
	}

	// A sandbox whose timeout passes is reaped, and counted.
	reaped := `agentenv_sandboxes_reaped_total{role="serve"}`
	e.create(t, client.CreateRequest{Timeout: new(int64(1))})
	deadline = time.Now().Add(20 * time.Second)
	for e.scrapeMetrics(t)[reaped] < before[reaped]+1 {
		if time.Now().After(deadline) {
			t.Fatalf("%s: still %v 20 s after a 1 s timeout, want %v", reaped, e.scrapeMetrics(t)[reaped], before[reaped]+1)
		}
		time.Sleep(100 * time.Millisecond)
	}
	check("the reap", map[string]float64{running: before[running]})
}
