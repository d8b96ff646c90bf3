package bench

import (
	"strings"
	"testing"
	"time"
)

func TestSummarizeBandwidth(t *testing.T) {
	tests := []struct {
		name  string
		times []time.Duration
		want  Bandwidth
	}{
		{"empty", nil, Bandwidth{}},
		{"one", []time.Duration{time.Second}, Bandwidth{N: 1, MiB: 64, MedianMiBps: 64, MinMiBps: 64, MaxMiBps: 64}},
		// Unsorted input: the median is the middle time, min the slowest.
		{"three", []time.Duration{2 * time.Second, 500 * time.Millisecond, time.Second},
			Bandwidth{N: 3, MiB: 64, MedianMiBps: 64, MinMiBps: 32, MaxMiBps: 128}},
		{"zero time", []time.Duration{0}, Bandwidth{N: 1, MiB: 64}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := summarizeBandwidth(64, tt.times); got != tt.want {
				t.Errorf("summarizeBandwidth(64, %v) = %+v, want %+v", tt.times, got, tt.want)
			}
		})
	}
}

func TestWriteTableBandwidth(t *testing.T) {
	rep := Report{Template: "busybox", Iterations: 3, Targets: []string{TargetAgentenv, TargetRunsc},
		Stats:     map[string]map[Operation]Stats{TargetAgentenv: {OpProxyGet: {N: 3, P50Ms: 2, P95Ms: 3, MaxMs: 3}}},
		Bandwidth: map[string]map[Operation]Bandwidth{TargetAgentenv: {OpProxyDown: {N: 3, MiB: 64, MedianMiBps: 412.3}}}}
	var b strings.Builder
	if err := WriteTable(&b, rep); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, OpProxyDown.Label()) {
			if f := strings.Fields(strings.TrimPrefix(line, OpProxyDown.Label())); len(f) != 3 || f[0] != "412" || f[1] != "-" || f[2] != "-" {
				t.Errorf("download row: got %q, want 412, then '-' for runsc and its ratio", line)
			}
		}
	}
	if strings.Contains(out, OpProxyUp.Label()) {
		t.Errorf("table shows the unmeasured upload row:\n%s", out)
	}
	if !strings.Contains(out, "median of 3 transfers of 64 MiB") {
		t.Errorf("table header lacks the throughput note:\n%s", out)
	}
}
