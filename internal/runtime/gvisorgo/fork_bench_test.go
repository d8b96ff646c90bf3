package gvisorgo

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/runtime"
)

// BenchmarkFork measures what a fork of 16 costs the runtime: one
// checkpoint of an idle sandbox, then 16 restores of it at once, each until
// /bin/true has run in it (through the control socket). Sub-benchmarks vary
// where the checkpoint is written (disk: the test's directory; shm:
// /dev/shm) and whether the 16 containers were prepared in advance. It
// reports the p50 of the checkpoint and of the restores' wall time.
// GVISORGO_BENCH_WORKERS sets the number of workers. Measured on the 2-core
// host (2026-12-01): disk and shm alike; 16 restores ≈ 850 ms into new
// containers, ≈ 470 ms into prepared ones, the same with 2, 4 or 8
// workers (the restores are CPU-bound, about half of it building the
// sandbox's seccomp filter). Run it as root, e.g.:
//
//	go test -run '^$' -bench Fork -benchtime 5x ./internal/runtime/gvisorgo/
func BenchmarkFork(b *testing.B) {
	e := newEnv(b)
	g := benchRuntime(b, e)
	ctx := context.Background()
	parent := e.spec(b, g)
	must(b, g.Create(ctx, parent))
	running(b, g, parent.ID)
	const n = 16
	for _, where := range []string{"disk", "shm"} {
		for _, prepared := range []bool{false, true} {
			b.Run(fmt.Sprintf("%s/prepared=%v", where, prepared), func(b *testing.B) {
				var cps, walls []time.Duration
				for b.Loop() {
					base := e.dir
					if where == "shm" {
						base = "/dev/shm"
					}
					dir, err := os.MkdirTemp(base, "fork-bench-")
					must(b, err)
					t0 := time.Now()
					must(b, g.Checkpoint(ctx, parent.ID, dir))
					cps = append(cps, time.Since(t0))
					specs := make([]runtime.Spec, n)
					for i := range specs {
						specs[i] = e.spec(b, g)
					}
					if prepared {
						var wg sync.WaitGroup
						for _, s := range specs {
							wg.Go(func() {
								if err := g.Prepare(ctx, s); err != nil {
									b.Errorf("prepare: %v", err)
								}
							})
						}
						wg.Wait()
					}
					t0 = time.Now()
					var wg sync.WaitGroup
					for _, s := range specs {
						wg.Go(func() {
							if err := g.Restore(ctx, s, dir); err != nil {
								b.Errorf("restore: %v", err)
								return
							}
							if code, out, err := g.Exec(ctx, s.ID, []string{"/bin/true"}); err != nil || code != 0 {
								b.Errorf("exec true: code %d, err %v, output %q", code, err, out)
							}
						})
					}
					wg.Wait()
					walls = append(walls, time.Since(t0))
					for _, s := range specs {
						must(b, g.Destroy(ctx, s.ID))
					}
					os.RemoveAll(dir)
				}
				slices.Sort(cps)
				slices.Sort(walls)
				ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
				b.ReportMetric(ms(cps[len(cps)/2]), "checkpoint-p50-ms")
				b.ReportMetric(ms(walls[len(walls)/2]), "restore16-p50-ms")
				b.ReportMetric(ms(walls[0]), "restore16-min-ms")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}
