package bench

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"time"
)

// Incremental snapshots: a sandbox along a trajectory, 16 MiB of its
// memory changed before each snapshot. agentenv stores only the pages its
// previous snapshot lacks; a raw `runsc checkpoint` writes everything.
const (
	incrBaseMiB    = 32 // /dev/shm data the sandbox holds throughout
	incrChangedMiB = 16 // rewritten before each snapshot
)

// Storage is what the snapshots of a row added to disk, per snapshot.
type Storage struct {
	N int `json:"n"`
	// MedianMiB is the median over the snapshots; MaxMiB the largest.
	MedianMiB float64 `json:"median_mib"`
	MaxMiB    float64 `json:"max_mib"`
}

// storer is a snapper that says what a snapshot added to disk.
type storer interface {
	snapper
	// snapshotStored snapshots like snapshot and returns the bytes the
	// snapshot added to disk.
	snapshotStored(ctx context.Context, id string) (string, int64, error)
}

func (t *agentenvTarget) snapshotStored(ctx context.Context, id string) (string, int64, error) {
	sn, err := t.c.SnapshotSandbox(ctx, id, "", map[string]string{benchLabel: t.run})
	if err != nil {
		return "", 0, err
	}
	t.mu.Lock()
	t.snaps[sn.SnapshotID] = true
	t.mu.Unlock()
	return sn.SnapshotID, sn.StoredBytes, nil
}

func (r *runscTarget) snapshotStored(ctx context.Context, id string) (string, int64, error) {
	dir, err := r.snapshot(ctx, id)
	if err != nil {
		return "", 0, err
	}
	var n int64
	err = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err == nil {
			n += info.Size()
		}
		return err
	})
	return dir, n, err
}

// incremental measures snapshots of a sandbox that changed incrChangedMiB
// since its previous snapshot, which it keeps (the base of the next).
func (r *runner) incremental(ctx context.Context) error {
	return r.withSandboxes(ctx, 0, func(ids map[string]string) error {
		r.progressf("snapshot (incremental): writing %d MiB into /dev/shm, then %d MiB of it changed before each snapshot", incrBaseMiB, incrChangedMiB)
		var steps []step
		var cleanups []func() error
		defer func() {
			for _, c := range slices.Backward(cleanups) {
				c()
			}
		}()
		stored := map[string][]int64{}
		for _, s := range r.snappers() {
			st, ok := s.(storer)
			if !ok {
				continue
			}
			id := ids[s.name()]
			if err := s.sh(ctx, id, fmt.Sprintf("dd if=/dev/urandom of=/dev/shm/state bs=1M count=%d 2>/dev/null", incrBaseMiB)); err != nil {
				return fmt.Errorf("%s: write %d MiB: %w", s.name(), incrBaseMiB, err)
			}
			first, _, err := st.snapshotStored(ctx, id)
			if err != nil {
				return fmt.Errorf("%s: first snapshot: %w", s.name(), err)
			}
			// The latest snapshot is kept (the next one's base); the one
			// before it goes once the next is taken.
			keep := []string{first}
			cleanups = append(cleanups, func() error {
				var errs []error
				for _, k := range keep {
					errs = append(errs, s.dropSnapshot(context.WithoutCancel(ctx), k))
				}
				return errors.Join(errs...)
			})
			round := 0
			steps = append(steps, step{s.name(), func(ctx context.Context) (map[Operation]time.Duration, error) {
				round++
				script := fmt.Sprintf("dd if=/dev/urandom of=/dev/shm/state bs=1M count=%d seek=%d conv=notrunc 2>/dev/null",
					incrChangedMiB, (round%(incrBaseMiB/incrChangedMiB))*incrChangedMiB)
				if err := s.sh(ctx, id, script); err != nil {
					return nil, fmt.Errorf("change %d MiB: %w", incrChangedMiB, err)
				}
				start := time.Now()
				snap, n, err := st.snapshotStored(ctx, id)
				if err != nil {
					return nil, fmt.Errorf("snapshot: %w", err)
				}
				d := time.Since(start)
				stored[s.name()] = append(stored[s.name()], n)
				if err := s.dropSnapshot(ctx, keep[0]); err != nil {
					return nil, fmt.Errorf("delete snapshot: %w", err)
				}
				keep = []string{snap}
				return map[Operation]time.Duration{OpSnapIncr: d}, nil
			}})
		}
		if err := r.rounds(ctx, fmt.Sprintf("snapshot (incremental, %d MiB changed)", incrChangedMiB), r.cfg.HeavyIterations, 1, steps); err != nil {
			return err
		}
		for name, ns := range stored {
			r.setStorage(name, OpSnapStored, ns[1:]) // without the warm-up round
		}
		return nil
	})
}

func (r *runner) setStorage(target string, op Operation, ns []int64) {
	if len(ns) == 0 {
		return
	}
	if r.rep.Storage == nil {
		r.rep.Storage = map[string]map[Operation]Storage{}
	}
	if r.rep.Storage[target] == nil {
		r.rep.Storage[target] = map[Operation]Storage{}
	}
	r.rep.Storage[target][op] = summarizeStorage(ns)
}

func summarizeStorage(ns []int64) Storage {
	s := slices.Clone(ns)
	slices.Sort(s)
	med := float64(s[len(s)/2])
	if len(s)%2 == 0 {
		med = float64(s[len(s)/2-1]+s[len(s)/2]) / 2
	}
	return Storage{N: len(s), MedianMiB: med / (1 << 20), MaxMiB: float64(s[len(s)-1]) / (1 << 20)}
}
