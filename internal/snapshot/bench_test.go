package snapshot

import (
	"bytes"
	"testing"
	"time"
)

// BenchmarkIncremental measures the store's part of a snapshot of a
// sandbox with 48 MiB of memory, 16 MiB of it changed since its previous
// snapshot (hash every page, write the new ones), and a restore of it (put
// the pages file together from its extents).
func BenchmarkIncremental(b *testing.B) {
	s, err := Open(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	mem := newMemory(9, 48<<20/PageSize)
	var prev string
	var hash, write, restore time.Duration
	var stored int64
	for b.Loop() {
		b.StopTimer()
		mem.change(16 << 20)
		dir := ckpt(b, s, map[string][]byte{"pages.img": bytes.Clone(mem.data)})
		b.StartTimer()
		sn, err := s.Add(dir, Snapshot{Sandbox: "sb"})
		if err != nil {
			b.Fatal(err)
		}
		hash, write, stored = hash+sn.Timing.Hash, write+sn.Timing.Write, stored+sn.Stored
		start := time.Now()
		_, done, release, err := s.Acquire(sn.ID)
		if err != nil {
			b.Fatal(err)
		}
		done()
		release()
		restore += time.Since(start)
		b.StopTimer()
		if prev != "" {
			s.Delete(prev)
		}
		prev = sn.ID
		b.StartTimer()
	}
	n := float64(b.N)
	b.ReportMetric(float64(hash.Milliseconds())/n, "hash-ms/op")
	b.ReportMetric(float64(write.Milliseconds())/n, "write-ms/op")
	b.ReportMetric(float64(restore.Milliseconds())/n, "restore-ms/op")
	b.ReportMetric(float64(stored)/n/(1<<20), "stored-MiB/op")
}
