package gvisorgo

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkCreateParallel measures create + start + first exec (`true`
// through the control socket) with 1, 2, 4 and 8 cycles in flight, each
// cycle destroying its sandbox after the timed part. It reports the p50 and
// p95 of a cycle's timed part and the cycles completed per second of wall
// time (destroys included). GVISORGO_BENCH_WORKERS sets the number of
// workers (default: Config's). Run it as root, e.g.:
//
//	go test -run '^$' -bench CreateParallel -benchtime 40x ./internal/runtime/gvisorgo/
func BenchmarkCreateParallel(b *testing.B) {
	e := newEnv(b)
	g := benchRuntime(b, e)
	ctx := context.Background()
	for _, n := range []int{1, 2, 4, 8} {
		b.Run(fmt.Sprintf("inflight=%d", n), func(b *testing.B) {
			var (
				mu   sync.Mutex
				lat  []time.Duration
				next atomic.Int64
				wg   sync.WaitGroup
			)
			start := time.Now()
			for range n {
				wg.Go(func() {
					for next.Add(1) <= int64(b.N) {
						s := e.spec(b, g)
						t0 := time.Now()
						if err := g.Create(ctx, s); err != nil {
							b.Errorf("create: %v", err)
							return
						}
						if code, out, err := g.Exec(ctx, s.ID, []string{"/bin/true"}); err != nil || code != 0 {
							b.Errorf("exec true: code %d, err %v, output %q", code, err, out)
							return
						}
						d := time.Since(t0)
						if err := g.Destroy(ctx, s.ID); err != nil {
							b.Errorf("destroy: %v", err)
							return
						}
						mu.Lock()
						lat = append(lat, d)
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			wall := time.Since(start)
			if len(lat) == 0 {
				return
			}
			slices.Sort(lat)
			ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
			b.ReportMetric(ms(lat[len(lat)/2]), "p50-ms")
			b.ReportMetric(ms(lat[(len(lat)*95+99)/100-1]), "p95-ms")
			b.ReportMetric(float64(len(lat))/wall.Seconds(), "cycles/s")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// benchRuntime is the benchmarks' runtime, with GVISORGO_BENCH_WORKERS
// workers when set.
func benchRuntime(b *testing.B, e testEnv) *Gvisor {
	cfg := Config{Root: filepath.Join(e.dir, "root")}
	if v := os.Getenv("GVISORGO_BENCH_WORKERS"); v != "" {
		cfg.Workers, _ = strconv.Atoi(v)
	}
	return e.newRuntimeConfig(b, cfg)
}
