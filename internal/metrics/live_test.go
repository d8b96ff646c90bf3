package metrics_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/metrics"
)

// TestLive reads latency quantiles per interval, errors by cause and the
// host from a registry, as the live page does.
func TestLive(t *testing.T) {
	reg := metrics.New("serve")
	// 100 creates: 90 of 10 ms and 10 of 2 s.
	for i := range 100 {
		d := 10 * time.Millisecond
		if i >= 90 {
			d = 2 * time.Second
		}
		reg.ObserveOp(metrics.OpCreate, d, nil)
	}
	reg.ObserveOp(metrics.OpExec, time.Millisecond, errBusy)
	reg.SetCause(cause)
	reg.ObserveOp(metrics.OpFork, time.Second, errNotFound)
	reg.ObserveOp(metrics.OpFork, time.Second, errNotFound)

	live := reg.Live()
	if len(live.History) != 1 {
		t.Fatalf("got %d points before any sample, want 1 (since start)", len(live.History))
	}
	p := live.History[0]
	c := p.Ops[metrics.OpCreate]
	if c.N != 100 {
		t.Errorf("create count: got %d, want 100", c.N)
	}
	// p50 falls in the (5 ms, 10 ms] bucket; p95 in (1 s, 2.5 s].
	if c.P50 <= 0.005 || c.P50 > 0.010 {
		t.Errorf("create p50: got %v s, want in (0.005, 0.010]", c.P50)
	}
	if c.P95 <= 1 || c.P95 > 2.5 {
		t.Errorf("create p95: got %v s, want in (1, 2.5]", c.P95)
	}
	if f := p.Ops[metrics.OpFork]; f.N != 2 || math.Abs(f.P50-0.75) > 1e-9 {
		t.Errorf("fork: got %+v, want 2 with p50 0.75 s (interpolated in (0.5, 1])", f)
	}
	if p.MemTotal <= 0 || p.MemUsed <= 0 || p.MemUsed > p.MemTotal {
		t.Errorf("host memory: got used %d of %d", p.MemUsed, p.MemTotal)
	}
	want := map[[2]string]int64{{"exec", "error"}: 1, {"fork", "not_found"}: 2}
	if len(live.Errors) != len(want) {
		t.Errorf("errors: got %+v, want %v", live.Errors, want)
	}
	for _, e := range live.Errors {
		if want[[2]string{e.Op, e.Cause}] != e.N {
			t.Errorf("errors: got %+v, want %v", e, want)
		}
	}

	// Sampled intervals: each holds only what ended in it.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { reg.RunHistory(ctx, 20*time.Millisecond, 3); close(done) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(30 * time.Second)
	// Wait until the first interval (with the creates) has rolled out.
	for h := reg.Live().History; len(h) < 4 || h[0].Ops[metrics.OpCreate].N != 0; h = reg.Live().History {
		if time.Now().After(deadline) {
			t.Fatalf("history: %d points after 30 s, want 3 kept + now, the creates' interval gone", len(h))
		}
		time.Sleep(10 * time.Millisecond)
	}
	// No more samples: three more ticks (60 ms, one stall on a loaded
	// host) between the exec and the read would roll the exec out too.
	cancel()
	<-done
	reg.ObserveOp(metrics.OpExec, 3*time.Millisecond, nil)
	h := reg.Live().History
	if len(h) != 4 {
		t.Fatalf("history: got %d points, want 4 (3 kept + now)", len(h))
	}
	var execs int64
	for _, p := range h {
		execs += p.Ops[metrics.OpExec].N
		if p.Ops[metrics.OpCreate].N != 0 {
			t.Errorf("point at %v: %d creates, want 0 (their interval rolled out)", p.At, p.Ops[metrics.OpCreate].N)
		}
	}
	if execs != 1 {
		t.Errorf("execs over the history: got %d, want 1", execs)
	}
}

// TestLiveOutcomes: each interval of the live history counts the commands
// by result and the sandbox ends by cause that happened in it, all label
// values together, every class present.
func TestLiveOutcomes(t *testing.T) {
	reg := metrics.New("serve")
	if err := reg.SetLabelKey("run", 1); err != nil {
		t.Fatal(err)
	}
	reg.SetMetadata(func(id string) map[string]string { return map[string]string{"run": id} })
	reg.ObserveExec(metrics.ExecOK, "r1")
	reg.ObserveExec(metrics.ExecOK, "r2")
	reg.ObserveExec(metrics.ExecOOM, "r1")
	reg.ObserveSandboxEnd(metrics.EndTimeout, map[string]string{"run": "r3"})
	p := reg.Live().History[0]
	for _, tc := range []struct {
		what string
		got  map[string]int64
		want map[string]int64
	}{
		{"exec", p.Exec, map[string]int64{"ok": 2, "nonzero": 0, "timeout": 0, "oom": 1, "error": 0}},
		{"ends", p.Ends, map[string]int64{"killed": 0, "timeout": 1, "oom": 0, "lost": 0}},
	} {
		if len(tc.got) != len(tc.want) {
			t.Errorf("%s: got %v, want %v", tc.what, tc.got, tc.want)
		}
		for k, v := range tc.want {
			if n, ok := tc.got[k]; !ok || n != v {
				t.Errorf("%s %s: got %d (present %v), want %d", tc.what, k, n, ok, v)
			}
		}
	}
}
