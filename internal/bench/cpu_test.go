package bench

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseUsageUsec(t *testing.T) {
	tests := []struct {
		in      string
		want    time.Duration
		wantErr bool
	}{
		{"usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n", 2500 * time.Millisecond, false},
		{"user_usec 1\nusage_usec 7\n", 7 * time.Microsecond, false},
		{"user_usec 1\n", 0, true},
		{"usage_usec x\n", 0, true},
	}
	for _, tt := range tests {
		got, err := parseUsageUsec([]byte(tt.in))
		if got != tt.want || (err != nil) != tt.wantErr {
			t.Errorf("parseUsageUsec(%q) = %v, %v; want %v, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestCPUGroupUsageSumsExtra(t *testing.T) {
	dir, extra := t.TempDir(), t.TempDir()
	for _, d := range []string{dir, extra} {
		if err := os.WriteFile(filepath.Join(d, "cpu.stat"), []byte("usage_usec 1500\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// An extra cgroup that does not exist yet (no sandbox made it) counts 0.
	g := &cpuGroup{dir: dir, extra: []string{extra, filepath.Join(extra, "not-yet")}}
	if got, err := g.usage(); err != nil || got != 3*time.Millisecond {
		t.Errorf("usage = %v, %v; want 3ms", got, err)
	}
	g = &cpuGroup{dir: filepath.Join(dir, "gone")}
	if _, err := g.usage(); err == nil {
		t.Error("usage of a missing cgroup: got nil error, want one")
	}
}

func TestNetCPU(t *testing.T) {
	tests := []struct {
		used    time.Duration
		idle    float64
		elapsed time.Duration
		want    time.Duration
	}{
		{500 * time.Millisecond, 0, 2 * time.Second, 500 * time.Millisecond},
		{500 * time.Millisecond, 0.01, 2 * time.Second, 480 * time.Millisecond},
		{10 * time.Millisecond, 0.5, time.Second, 0}, // never negative
	}
	for _, tt := range tests {
		if got := netCPU(tt.used, tt.idle, tt.elapsed); got != tt.want {
			t.Errorf("netCPU(%v, %v, %v) = %v, want %v", tt.used, tt.idle, tt.elapsed, got, tt.want)
		}
	}
	if got := rate(250*time.Millisecond, 500*time.Millisecond); got != 0.5 {
		t.Errorf("rate = %v, want 0.5", got)
	}
	if got := rate(time.Second, 0); got != 0 {
		t.Errorf("rate over nothing = %v, want 0", got)
	}
}

// fakeCPU is a target's CPU counter on a fake clock: it runs at idle
// (CPU seconds per second) and, until busyUntil, at busy more.
type fakeCPU struct {
	now       time.Time
	used      time.Duration
	idle      float64
	busy      float64
	busyUntil time.Time
}

func (f *fakeCPU) advance(d time.Duration) {
	for step := time.Millisecond; d > 0; d -= step {
		r := f.idle
		if f.now.Before(f.busyUntil) {
			r += f.busy
		}
		f.used += time.Duration(r * float64(step))
		f.now = f.now.Add(step)
	}
}

func (f *fakeCPU) meter() *cpuMeter {
	return &cpuMeter{
		read:  func() (time.Duration, error) { return f.used, nil },
		now:   func() time.Time { return f.now },
		sleep: func(_ context.Context, d time.Duration) error { f.advance(d); return nil },
	}
}

func TestCPUMeterCountsTheTailAndSubtractsIdle(t *testing.T) {
	f := &fakeCPU{now: time.Unix(0, 0), idle: 0.02, busy: 1}
	m := f.meter()
	if err := m.calibrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if m.idle < 0.019 || m.idle > 0.021 {
		t.Fatalf("idle = %v, want 0.02", m.idle)
	}
	// The work takes 100 ms of one core, then leaves 300 ms of a core's
	// work behind (a teardown after the answer).
	cpu, wall, err := m.measure(context.Background(), func(context.Context) error {
		f.busyUntil = f.now.Add(400 * time.Millisecond)
		f.advance(100 * time.Millisecond)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if cpu < 395*time.Millisecond || cpu > 405*time.Millisecond {
		t.Errorf("cpu = %v, want 400ms: the work and its tail, without idle", cpu)
	}
	if wall != 100*time.Millisecond {
		t.Errorf("wall = %v, want 100ms: the work alone", wall)
	}
}

func TestCPUMeterGivesUpWaitingForQuiet(t *testing.T) {
	f := &fakeCPU{now: time.Unix(0, 0), busy: 1}
	f.busyUntil = f.now.Add(time.Hour)
	m := f.meter()
	start := f.now
	if _, _, err := m.waitQuiet(context.Background()); err != nil {
		t.Fatal(err)
	}
	if waited := f.now.Sub(start); waited < quietMax || waited > quietMax+quietWindow {
		t.Errorf("waited %v for a target that never goes quiet, want about %v", waited, quietMax)
	}
}

func TestSummarizeCPU(t *testing.T) {
	got := summarizeCPU([]cpuSample{
		{cpu: 400 * time.Millisecond, wall: 800 * time.Millisecond, ops: 4},
		{cpu: 480 * time.Millisecond, wall: 1200 * time.Millisecond, ops: 4},
		{cpu: 440 * time.Millisecond, wall: 1000 * time.Millisecond, ops: 4},
		{ops: 0}, // a churn batch that finished no cycle: ignored
	})
	if got.Ops != 4 || got.MedianMs != 110 || got.MinMs != 100 || got.MaxMs != 120 || got.WallMs != 250 || len(got.BatchesMs) != 3 {
		t.Errorf("summarizeCPU = %+v, want 4 ops, median 110, min 100, max 120, wall 250, 3 batches", got)
	}
	if got := summarizeCPU(nil); len(got.BatchesMs) != 0 || got.MedianMs != 0 {
		t.Errorf("summarizeCPU(nil) = %+v, want zero", got)
	}
	if got := median([]float64{1, 2, 3, 10}); got != 2.5 {
		t.Errorf("median of an even count = %v, want 2.5", got)
	}
}

func TestWriteCPU(t *testing.T) {
	cost := func(ms ...float64) CPUCost { return summarizeCPU(samplesOf(ms)) }
	rep := Report{
		Targets: []string{TargetAgentenv, TargetRunsc, TargetCrun}, CPURounds: 3, ChurnInFlight: 8,
		CPU: map[string]map[Operation]CPUCost{
			TargetAgentenv: {OpCreate: cost(60, 62, 58), OpSnapshot: cost(30, 30, 30), OpChurnCycle: cost(90, 90, 90)},
			TargetRunsc:    {OpCreate: cost(40, 40, 40), OpSnapshot: cost(20, 20, 20), OpChurnCycle: cost(60, 60, 60)},
			TargetCrun:     {OpCreate: cost(6, 6, 6), OpChurnCycle: cost(9, 9, 9)},
		},
		CPUIdle: map[string]float64{TargetAgentenv: 1.25},
	}
	var b strings.Builder
	if err := writeCPU(&b, rep); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"median of 3 batches",
		"agentenv/runsc", "agentenv/crun",
		"60.0 (58.0–62.0) [120]", // median (min–max) [wall]
		"1.5x", "10.0x",          // create: 60/40, 60/6
		"churn cycle: create+exec+kill, 8 in flight",
		"idle, subtracted (ms CPU per s)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("CPU table lacks %q; got:\n%s", want, out)
		}
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "exec") || strings.HasPrefix(line, "kill") {
			t.Errorf("row no target measured is printed: %q", line)
		}
		if strings.HasPrefix(line, "snapshot") && !strings.HasSuffix(strings.TrimSpace(line), "-") {
			t.Errorf("snapshot row: got %q, want '-' for crun and its ratio", line)
		}
	}
	var none strings.Builder
	if err := writeCPU(&none, Report{Targets: []string{TargetAgentenv}}); err != nil || none.Len() != 0 {
		t.Errorf("no CPU rows: wrote %q, %v; want nothing", none.String(), err)
	}
}

// samplesOf makes batches of one operation each taking ms of CPU and
// twice that of wall time.
func samplesOf(ms []float64) []cpuSample {
	var out []cpuSample
	for _, v := range ms {
		d := time.Duration(v * float64(time.Millisecond))
		out = append(out, cpuSample{cpu: d, wall: 2 * d, ops: 1})
	}
	return out
}
