package bench

import (
	"math"
	"slices"
	"time"
)

// Stats summarises the samples of one operation on one target.
type Stats struct {
	N     int     `json:"n"`
	P50Ms float64 `json:"p50_ms"`
	P95Ms float64 `json:"p95_ms"`
	MaxMs float64 `json:"max_ms"`
}

// Summarize computes p50, p95 and max of samples. It does not modify
// samples. An empty input gives zero Stats.
func Summarize(samples []time.Duration) Stats {
	if len(samples) == 0 {
		return Stats{}
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	return Stats{
		N:     len(s),
		P50Ms: ms(Percentile(s, 50)),
		P95Ms: ms(Percentile(s, 95)),
		MaxMs: ms(s[len(s)-1]),
	}
}

// Percentile returns the p-th percentile (0 < p <= 100) of sorted by the
// nearest-rank method: the smallest sample with at least p% of the samples
// at or below it. Nearest rank always returns a value that was measured,
// which is what a latency table should show; interpolation would invent
// times between two runs. sorted must be in ascending order.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(n)))
	rank = min(max(rank, 1), n)
	return sorted[rank-1]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
