package bench

import (
	"slices"
	"testing"
	"time"
)

func msList(v ...int) []time.Duration {
	out := make([]time.Duration, len(v))
	for i, x := range v {
		out[i] = time.Duration(x) * time.Millisecond
	}
	return out
}

func TestPercentile(t *testing.T) {
	oneToTwenty := msList(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20)
	tests := []struct {
		name   string
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{"empty", nil, 50, 0},
		{"one sample p50", msList(7), 50, 7 * time.Millisecond},
		{"one sample p95", msList(7), 95, 7 * time.Millisecond},
		{"two samples p50 is the lower", msList(1, 2), 50, 1 * time.Millisecond},
		{"two samples p95 is the upper", msList(1, 2), 95, 2 * time.Millisecond},
		{"odd count p50 is the middle", msList(1, 2, 3, 4, 5), 50, 3 * time.Millisecond},
		{"20 samples p50", oneToTwenty, 50, 10 * time.Millisecond},
		{"20 samples p95", oneToTwenty, 95, 19 * time.Millisecond},
		{"20 samples p100", oneToTwenty, 100, 20 * time.Millisecond},
		{"p near zero is the minimum", oneToTwenty, 0.01, 1 * time.Millisecond},
		{"p zero clamps to the minimum", oneToTwenty, 0, 1 * time.Millisecond},
		{"p above 100 clamps to the maximum", oneToTwenty, 150, 20 * time.Millisecond},
		{"100 samples p95", msList(seq(1, 100)...), 95, 95 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Percentile(tt.sorted, tt.p); got != tt.want {
				t.Errorf("Percentile(%v, %v) = %v, want %v", tt.sorted, tt.p, got, tt.want)
			}
		})
	}
}

func seq(from, to int) []int {
	var out []int
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}

func TestSummarize(t *testing.T) {
	tests := []struct {
		name    string
		samples []time.Duration
		want    Stats
	}{
		{"empty", nil, Stats{}},
		{"unsorted input", msList(30, 10, 20), Stats{N: 3, P50Ms: 20, P95Ms: 30, MaxMs: 30}},
		{"sub-millisecond", []time.Duration{1500 * time.Microsecond, 500 * time.Microsecond}, Stats{N: 2, P50Ms: 0.5, P95Ms: 1.5, MaxMs: 1.5}},
		{"one outlier shows in max, not p50", msList(5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 900),
			Stats{N: 20, P50Ms: 5, P95Ms: 5, MaxMs: 900}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := slices.Clone(tt.samples)
			got := Summarize(in)
			if got != tt.want {
				t.Errorf("Summarize(%v) = %+v, want %+v", tt.samples, got, tt.want)
			}
			if !slices.Equal(in, tt.samples) {
				t.Errorf("Summarize reordered its input: got %v, want %v", in, tt.samples)
			}
		})
	}
}
