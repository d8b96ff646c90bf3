package bench

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestCheckExecution(t *testing.T) {
	tests := []struct {
		name, answer, want string
	}{
		{"main result", `{"type":"number_of_executions","execution_count":1}
{"type":"stdout","text":"hi\n","timestamp":"x"}
{"type":"result","text":"2","is_main_result":true}
{"type":"end_of_execution"}
`, ""},
		{"display data is not the main result", `{"type":"result","text":"3","is_main_result":false}
{"type":"result","text":"2","is_main_result":true}
{"type":"end_of_execution"}
`, ""},
		{"wrong result", `{"type":"result","text":"3","is_main_result":true}
{"type":"end_of_execution"}
`, `the cell's result is "3", want "2"`},
		{"error", `{"type":"error","name":"NameError","value":"name 'x' is not defined","traceback":"..."}
{"type":"end_of_execution"}
`, "the cell raised NameError"},
		{"cut short", `{"type":"result","text":"2","is_main_result":true}
`, "ended before end_of_execution"},
		{"not JSON", "<html>\n", "not JSON"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkExecution(strings.NewReader(tt.answer), "2")
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("got %v, want no error", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("got %v, want an error with %q", err, tt.want)
			}
		})
	}
}

func TestSFAnswerCheck(t *testing.T) {
	ok := sfAnswer{Status: "Success"}
	ok.RunResult = &struct {
		Status string `json:"status"`
		Stdout string `json:"stdout"`
		Stderr string `json:"stderr"`
	}{Status: "Finished", Stdout: rlWant}
	if err := ok.check(); err != nil {
		t.Fatalf("got %v for a successful call, want nil", err)
	}
	for _, a := range []sfAnswer{
		{Status: "SandboxError", Message: "the runner template is being built"},
		{Status: "Success"},
	} {
		if err := a.check(); err == nil {
			t.Errorf("got nil for %+v, want an error", a)
		}
	}
	wrong := ok
	wrong.RunResult = &struct {
		Status string `json:"status"`
		Stdout string `json:"stdout"`
		Stderr string `json:"stderr"`
	}{Status: "Finished", Stdout: "1\n"}
	if err := wrong.check(); err == nil {
		t.Error("got nil for the wrong stdout, want an error")
	}
}

func TestInFlight(t *testing.T) {
	var calls, now, peak atomic.Int64
	var mu sync.Mutex
	release := make(chan struct{})
	go func() {
		// Let the calls pile up before any returns, so the bound is seen.
		for calls.Load() < 4 {
			time.Sleep(time.Millisecond)
		}
		close(release)
	}()
	cpu, err := inFlight(context.Background(), 4, 10, func(ctx context.Context) (time.Duration, error) {
		n := now.Add(1)
		mu.Lock()
		peak.Store(max(peak.Load(), n))
		mu.Unlock()
		calls.Add(1)
		<-release
		now.Add(-1)
		return time.Millisecond, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := calls.Load(); got != 10 {
		t.Errorf("got %d calls, want 10", got)
	}
	if got := peak.Load(); got != 4 {
		t.Errorf("got %d calls at once at most, want 4", got)
	}
	if cpu != 10*time.Millisecond {
		t.Errorf("got CPU %s, want the sum of the calls' 10ms", cpu)
	}

	boom := errors.New("boom")
	calls.Store(0)
	_, err = inFlight(context.Background(), 2, 100, func(ctx context.Context) (time.Duration, error) {
		if calls.Add(1) == 3 {
			return 0, boom
		}
		return 0, nil
	})
	if !errors.Is(err, boom) {
		t.Fatalf("got %v, want the failing call's error", err)
	}
	if got := calls.Load(); got >= 100 {
		t.Errorf("got %d calls after a failure, want the batch to stop", got)
	}
}

func TestCallRatePerSecond(t *testing.T) {
	// Two batches of 16 calls in 4 s and 2 s: 250 and 125 ms per call,
	// median 187.5 ms, so 5.33 calls/s; CPU 100 and 60 ms per call.
	c := CallRate{InFlight: 16, CPU: summarizeCPU([]cpuSample{
		{cpu: 1600 * time.Millisecond, wall: 4 * time.Second, ops: 16},
		{cpu: 960 * time.Millisecond, wall: 2 * time.Second, ops: 16},
	})}
	if got, want := c.PerSecond(), 1000/187.5; got != want {
		t.Errorf("got %v calls/s, want %v", got, want)
	}
	if got, want := c.CPU.MedianMs, 80.0; got != want {
		t.Errorf("got %v CPU ms per call, want %v", got, want)
	}
	if got := (CallRate{}).PerSecond(); got != 0 {
		t.Errorf("got %v calls/s with no batch, want 0", got)
	}
}

func TestSandboxFusionLine(t *testing.T) {
	log := `time=2026-12-03T18:00:00Z level=INFO msg="agentenv serving" api=127.0.0.1:4000 proxy=127.0.0.1:4001
time=2026-12-03T18:00:00Z level=INFO msg="sandboxfusion serving" addr=127.0.0.1:40123 url=http://127.0.0.1:40123/run_code auth=none
`
	m := sandboxFusionLine.FindStringSubmatch(log)
	if m == nil || m[1] != "127.0.0.1:40123" {
		t.Fatalf("got %q, want the address 127.0.0.1:40123", m)
	}
}

func TestWriteRL(t *testing.T) {
	rate := func(level int, perCallMs, cpuMs float64, counted bool) CallRate {
		return CallRate{InFlight: level, CPUCounted: counted, CPU: CPUCost{Ops: 16, BatchesMs: []float64{cpuMs}, MedianMs: cpuMs, MinMs: cpuMs, MaxMs: cpuMs, WallMs: perCallMs}}
	}
	rep := Report{CPURounds: 1, RL: &RLReport{
		RunCode:    Stats{N: 20, P50Ms: 12, P95Ms: 15, MaxMs: 20},
		RunCodeCPU: CPUCost{BatchesMs: []float64{3}, MedianMs: 3, MinMs: 3, MaxMs: 3, WallMs: 12},
		Calls: map[string][]CallRate{
			WaySandboxFusion: {rate(1, 200, 150, true), rate(16, 50, 140, true)},
			WayHost:          {rate(1, 20, 15, true), rate(16, 10, 15, true)},
			WaySandboxPerRun: {rate(1, 500, 400, false), rate(16, 100, 380, false)},
		},
		CodeInterpreterBuildSeconds: 150,
	}}
	var b strings.Builder
	if err := WriteTable(&b, rep); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"runCode 1 + 1", "12.0 / 15.0 / 20.0", "3.0 [12.0]",
		"calls/s, 1 in flight", "CPU ms/call, 16 in flight",
		"code-interpreter-v1 built in 150 s",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	rows := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		for _, w := range rlWays {
			if strings.HasPrefix(line, w.label) {
				rows[w.key] = strings.Join(strings.Fields(strings.TrimPrefix(line, w.label)), " ")
			}
		}
	}
	for key, want := range map[string]string{
		WaySandboxFusion: "5.0 150 20.0 140",
		WayHost:          "50.0 15.0 100 15.0",
		WaySandboxPerRun: "2.0 - 10.0 -", // CPU not counted
	} {
		if rows[key] != want {
			t.Errorf("row %s: got %q, want %q", key, rows[key], want)
		}
	}
	// Ways appear in table order: the service, a sandbox per call, the host.
	if i, j, k := strings.Index(out, rlWays[0].label), strings.Index(out, rlWays[1].label), strings.Index(out, rlWays[2].label); !(i < j && j < k) {
		t.Errorf("rows out of order:\n%s", out)
	}
}
