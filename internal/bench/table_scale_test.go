package bench

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"
)

// cells returns the single-spaced cells after label of the line that
// starts with label.
func cells(out, label string) (string, bool) {
	for _, line := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(line, label+" "); ok {
			return strings.Join(strings.Fields(rest), " "), true
		}
	}
	return "", false
}

func scaleReport() Report {
	return Report{
		Template: "busybox", Iterations: 20,
		ChurnSeconds: 5, ChurnLevels: []int{1, 2, 4}, ChurnInFlight: 2,
		Targets: []string{TargetAgentenv, TargetRunsc, TargetCrun},
		Churn: map[string]Throughput{
			TargetAgentenv: {InFlight: 2, Cycles: 50, PerSecond: 10},
			TargetRunsc:    {InFlight: 2, Cycles: 100, PerSecond: 20},
			TargetCrun:     {InFlight: 2, Cycles: 400, PerSecond: 80},
		},
		ChurnByLevel: map[string][]Throughput{
			TargetAgentenv: {
				{InFlight: 1, Cycles: 25, PerSecond: 5, HostCPUBusy: 0.5},
				{InFlight: 2, Cycles: 50, PerSecond: 10, HostCPUBusy: 0.9},
				{InFlight: 4, Cycles: 60, Failed: 3, PerSecond: 12, HostCPUBusy: 1},
			},
			TargetRunsc: {
				{InFlight: 1, Cycles: 50, PerSecond: 10, HostCPUBusy: 0.6},
				{InFlight: 2, Cycles: 100, PerSecond: 20, HostCPUBusy: 0.95},
				{InFlight: 4, Cycles: 100, PerSecond: 20, HostCPUBusy: 0.99},
			},
			// crun has no level 4: its cell and ratio are "-".
			TargetCrun: {
				{InFlight: 1, Cycles: 200, PerSecond: 40, HostCPUBusy: 0.7},
				{InFlight: 2, Cycles: 400, PerSecond: 80, HostCPUBusy: 0.98},
			},
		},
		DensityRuns: map[string]DensityRun{
			TargetAgentenv: {Requested: 1000, Parallel: 4, Started: 998, FailedCreates: 2, StartSeconds: 120,
				Create:              Stats{N: 998, P50Ms: 400, P95Ms: 900, MaxMs: 1500},
				MemAvailableDropMiB: 14970, ThreadsPerSandbox: 17.5, Answered: 997,
				Exec: Stats{N: 997, P50Ms: 20, P95Ms: 40, MaxMs: 80}, KillSeconds: 30},
			TargetRunsc: {Requested: 1000, Parallel: 4, Started: 1000, StartSeconds: 60,
				Create:              Stats{N: 1000, P50Ms: 200, P95Ms: 300, MaxMs: 400},
				MemAvailableDropMiB: 10000, ThreadsPerSandbox: 14, Answered: 1000,
				Exec: Stats{N: 1000, P50Ms: 40, P95Ms: 50, MaxMs: 60}, KillSeconds: 15},
		},
		Limits: &Limits{Sandboxes: 1000, First: "host_threads", FirstReachedAt: 1600, Rows: []LimitRow{
			{Key: "host_threads", Label: "threads on the host (all processes)", Before: 1000, After: 21000, PerSandbox: 20, At10x: 201000, Limit: 32768, LimitName: "kernel.pid_max", ReachedAt: 1588},
			{Key: "sandbox_proc_maps", Label: "memory maps of one sandbox process (most)", PerProcess: true, After: 53, At10x: 53, Limit: 65530, LimitName: "vm.max_map_count (per process)"},
			{Key: "nft_lines", Label: "nftables ruleset, lines (host)", Before: 200, After: 7200, PerSandbox: 7, At10x: 70200},
			{Key: "server_maps", Label: "memory maps of the server process", Before: 150, After: 151, PerSandbox: 0.001, At10x: 160, Limit: 65530, LimitName: "vm.max_map_count (per process)", ReachedAt: 65380000},
		}},
	}
}

func TestWriteTableChurnLevels(t *testing.T) {
	var b strings.Builder
	if err := WriteTable(&b, scaleReport()); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if !strings.Contains(out, "churn at 1,2,4 in flight for 5s per level and target (the churn row: 2 in flight)") {
		t.Errorf("header lacks the levels; got:\n%s", out)
	}
	tests := []struct{ label, want string }{
		{"1", "5.0/s (50%) 10.0/s (60%) 40.0/s (70%) 0.5x 0.1x"},
		{"2", "10.0/s (90%) 20.0/s (95%) 80.0/s (98%) 0.5x 0.1x"},
		{"4", "12.0/s (100%) 3 failed 20.0/s (99%) - 0.6x -"},
		// The main table's row shows the level of ChurnInFlight.
		{OpChurn.Label(), "10.0/s 20.0/s 80.0/s 0.5x 0.1x"},
	}
	for _, tt := range tests {
		if got, ok := cells(out, tt.label); !ok || got != tt.want {
			t.Errorf("row %q = %q, want %q; table:\n%s", tt.label, got, tt.want, out)
		}
	}
}

func TestWriteTableDensity(t *testing.T) {
	rep := scaleReport()
	rep.Churn, rep.ChurnByLevel = nil, nil
	var b strings.Builder
	if err := WriteTable(&b, rep); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if strings.Contains(out, "operation") {
		t.Errorf("main table printed with none of its rows measured; got:\n%s", out)
	}
	if !strings.Contains(out, "density: 1000 idle sandboxes per target") || !strings.Contains(out, "4 creates at a time") {
		t.Errorf("density header missing; got:\n%s", out)
	}
	tests := []struct{ label, want string }{
		{"sandboxes started", "998 of 1000 (2 failed) 1000 of 1000 -"},
		{"time to start them all (s)", "120 60.0 - 2.0x -"},
		{"create until a command runs (ms)", "400 / 900 / 1500 200 / 300 / 400 - 2.0x -"},
		{"host memory used (MemAvailable drop, MiB)", "14970 10000 -"},
		{"  per sandbox (MiB)", "15.0 10.0 - 1.5x -"},
		{"host threads per sandbox", "17.5 14.0 - 1.2x -"},
		{"answered /bin/true with all up", "997 of 998 1000 of 1000 -"},
		{"  exec /bin/true with all up (ms)", "20.0 / 40.0 / 80.0 40.0 / 50.0 / 60.0 - 0.5x -"},
		{"time to kill them all (s)", "30.0 15.0 - 2.0x -"},
	}
	for _, tt := range tests {
		if got, ok := cells(out, tt.label); !ok || got != tt.want {
			t.Errorf("row %q = %q, want %q; table:\n%s", tt.label, got, tt.want, out)
		}
	}
}

func TestWriteTableLimits(t *testing.T) {
	var b strings.Builder
	if err := WriteTable(&b, scaleReport()); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	tests := []struct{ label, want string }{
		{"threads on the host (all processes)", "1000 21000 20.0 201000 32768 kernel.pid_max 1588"},
		// Per process: no "before", no per sandbox, never reached.
		{"memory maps of one sandbox process (most)", "- 53.0 - 53.0 65530 vm.max_map_count (per process) -"},
		{"nftables ruleset, lines (host)", "200 7200 7.0 70200 - -"},
		// Growth within the noise: not a number of sandboxes to quote.
		{"memory maps of the server process", "150 151 0.001 160 65530 vm.max_map_count (per process) > 100000"},
	}
	for _, tt := range tests {
		if got, ok := cells(out, tt.label); !ok || got != tt.want {
			t.Errorf("row %q = %q, want %q; table:\n%s", tt.label, got, tt.want, out)
		}
	}
	for _, want := range []string{"with 1000 up, extrapolated linearly to 10000", "first limit reached: threads on the host (all processes), at about 1600 sandboxes"} {
		if !strings.Contains(out, want) {
			t.Errorf("limits table lacks %q; got:\n%s", want, out)
		}
	}
}

func TestReportJSONScaleRows(t *testing.T) {
	b, err := json.Marshal(scaleReport())
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		ChurnLevels  []int                       `json:"churn_levels"`
		ChurnByLevel map[string][]map[string]any `json:"churn_by_level"`
		DensityRuns  map[string]map[string]any   `json:"density_runs"`
		Limits       struct {
			Sandboxes int              `json:"sandboxes"`
			First     string           `json:"first"`
			Rows      []map[string]any `json:"rows"`
		} `json:"limits"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.ChurnLevels, []int{1, 2, 4}) {
		t.Errorf("churn_levels = %v, want [1 2 4]", got.ChurnLevels)
	}
	if lv := got.ChurnByLevel[TargetAgentenv]; len(lv) != 3 || lv[2]["in_flight"] != 4.0 || lv[2]["host_cpu_busy"] != 1.0 || lv[2]["failed"] != 3.0 {
		t.Errorf("churn_by_level.agentenv = %v, want 3 levels, the last at 4 in flight with 3 failed and CPU busy 1", lv)
	}
	d := got.DensityRuns[TargetAgentenv]
	for key, want := range map[string]any{"requested": 1000.0, "started": 998.0, "failed_creates": 2.0, "answered": 997.0, "mem_available_drop_mib": 14970.0, "start_seconds": 120.0} {
		if d[key] != want {
			t.Errorf("density_runs.agentenv.%s = %v, want %v", key, d[key], want)
		}
	}
	if got.Limits.Sandboxes != 1000 || got.Limits.First != "host_threads" || len(got.Limits.Rows) != 4 || got.Limits.Rows[0]["reached_at"] != 1588.0 {
		t.Errorf("limits = %+v, want 1000 sandboxes, first host_threads, 4 rows", got.Limits)
	}
}

func TestParseLevels(t *testing.T) {
	got, err := ParseLevels("8, 1,2,2,16,4")
	if err != nil || !slices.Equal(got, []int{1, 2, 4, 8, 16}) {
		t.Errorf("ParseLevels = %v, %v; want [1 2 4 8 16]", got, err)
	}
	for _, bad := range []string{"", "0", "1,x", "-2"} {
		if _, err := ParseLevels(bad); err == nil {
			t.Errorf("ParseLevels(%q): got nil error, want one", bad)
		}
	}
}

func TestMainChurnLevel(t *testing.T) {
	tests := []struct {
		levels []int
		want   int
		got    int
	}{
		{[]int{1, 2, 4, 8, 16}, 8, 8},
		{[]int{1, 2, 4}, 8, 4}, // not measured: the highest
		{[]int{16}, 8, 16},
	}
	for _, tt := range tests {
		if got := mainChurnLevel(tt.levels, tt.want); got != tt.got {
			t.Errorf("mainChurnLevel(%v, %d) = %d, want %d", tt.levels, tt.want, got, tt.got)
		}
	}
}

// The churn group runs every level on every target, targets taking turns
// within a level, and the main row keeps the ChurnInFlight level.
func TestRunnerChurnLevels(t *testing.T) {
	a, b := &namedFake{n: TargetAgentenv}, &namedFake{n: TargetRunsc}
	rep := &Report{}
	r := &runner{cfg: Config{ChurnLevels: []int{1, 3}, ChurnInFlight: 3, ChurnDuration: 20 * time.Millisecond, Progress: nil}, rep: rep,
		ts: targets{all: []target{a, b}}}
	r.cfg.Progress = &strings.Builder{}
	if err := r.churn(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{TargetAgentenv, TargetRunsc} {
		lv := rep.ChurnByLevel[name]
		if len(lv) != 2 || lv[0].InFlight != 1 || lv[1].InFlight != 3 || lv[0].Cycles == 0 {
			t.Errorf("%s levels = %+v, want runs at 1 and 3 in flight", name, lv)
		}
		if rep.Churn[name].InFlight != 3 {
			t.Errorf("%s main churn row at %d in flight, want 3", name, rep.Churn[name].InFlight)
		}
	}
	progress := r.cfg.Progress.(*strings.Builder).String()
	want := []string{"agentenv, 1 in flight", "runsc, 1 in flight", "agentenv, 3 in flight", "runsc, 3 in flight"}
	last := -1
	for _, w := range want {
		i := strings.Index(progress, w)
		if i <= last {
			t.Errorf("progress %q: %q out of order, want %v", progress, w, want)
		}
		last = i
	}
}

// namedFake is a target that always succeeds, after a millisecond.
type namedFake struct{ n string }

func (f *namedFake) name() string { return f.n }
func (f *namedFake) create(context.Context) (string, error) {
	time.Sleep(time.Millisecond)
	return "id", nil
}
func (f *namedFake) exec(context.Context, string) error              { return nil }
func (f *namedFake) writeRead(context.Context, string, []byte) error { return nil }
func (f *namedFake) kill(context.Context, string) error              { return nil }

func TestRatio(t *testing.T) {
	tests := []struct {
		a, b float64
		ok   bool
		want string
	}{
		{150, 100, true, "1.5x"},
		{4.1, 114, true, "0.04x"}, // not 0.0x
		{1, 0, true, "-"},
		{1, 2, false, "-"},
	}
	for _, tt := range tests {
		if got := ratio(tt.a, tt.b, tt.ok); got != tt.want {
			t.Errorf("ratio(%v, %v, %v) = %q, want %q", tt.a, tt.b, tt.ok, got, tt.want)
		}
	}
}
