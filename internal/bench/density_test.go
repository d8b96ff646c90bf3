package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
)

// densityFake is a densityTarget that records what is alive; creates fail
// from the failFrom-th one on (0: never), and exec fails on the IDs in
// mute.
type densityFake struct {
	mu       sync.Mutex
	n        int
	live     map[string]bool
	maxLive  int
	failFrom int
	mute     map[string]bool
	probed   []string
}

func newDensityFake() *densityFake {
	return &densityFake{live: map[string]bool{}, mute: map[string]bool{}}
}

func (f *densityFake) name() string { return "fake" }

func (f *densityFake) createIdle(ctx context.Context) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	if f.failFrom > 0 && f.n >= f.failFrom {
		return "", errors.New("cannot read client sync file: EOF")
	}
	id := fmt.Sprintf("s%04d", f.n)
	f.live[id] = true
	f.maxLive = max(f.maxLive, len(f.live))
	return id, nil
}

func (f *densityFake) exec(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.mute[id] || !f.live[id] {
		return errors.New("no answer")
	}
	return nil
}

func (f *densityFake) release(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.live, id)
	return nil
}

// pidsIn names this test's own process: it has threads to count.
func (f *densityFake) pidsIn(context.Context, map[int]proc, string) ([]int, error) {
	return []int{os.Getpid()}, nil
}

func TestRunDensity(t *testing.T) {
	f := newDensityFake()
	f.mute["s0003"], f.mute["s0007"] = true, true
	o := densityOpts{n: 20, parallel: 4, maxFailsInRow: 5, probe: func(_ context.Context, ids []string) error {
		f.mu.Lock()
		defer f.mu.Unlock()
		if len(f.live) != len(ids) {
			t.Errorf("probe: %d sandboxes alive, want all %d up", len(f.live), len(ids))
		}
		f.probed = slices.Clone(ids)
		return nil
	}}
	d, err := runDensity(context.Background(), f, o)
	if err != nil {
		t.Fatal(err)
	}
	if d.Requested != 20 || d.Started != 20 || d.FailedCreates != 0 || d.Create.N != 20 {
		t.Errorf("run = %+v, want 20 of 20 started, 20 create samples", d)
	}
	if d.Answered != 18 || len(d.ExecErrors) != 2 || d.Exec.N != 18 {
		t.Errorf("answered %d (errors %q, %d samples), want 18 and the 2 mute sandboxes' errors", d.Answered, d.ExecErrors, d.Exec.N)
	}
	if len(f.probed) != 20 {
		t.Errorf("probe saw %d sandboxes, want 20", len(f.probed))
	}
	if len(f.live) != 0 || d.KillFailed != 0 {
		t.Errorf("%d left alive (%d kills failed), want all killed", len(f.live), d.KillFailed)
	}
	if f.maxLive != 20 {
		t.Errorf("at most %d up at once, want all 20", f.maxLive)
	}
	if d.ThreadsPerSandbox < 1 {
		t.Errorf("ThreadsPerSandbox = %v, want this process's threads (at least 1)", d.ThreadsPerSandbox)
	}
}

// A server that refuses every create from some point on (a ceiling): the
// run stops after maxFailsInRow, reports it, and kills what started.
func TestRunDensityCeiling(t *testing.T) {
	f := newDensityFake()
	f.failFrom = 8
	d, err := runDensity(context.Background(), f, densityOpts{n: 1000, parallel: 2, maxFailsInRow: 5})
	if err != nil {
		t.Fatal(err)
	}
	if d.Started != 7 || d.FailedCreates < 5 || d.FailedCreates > 6 {
		t.Errorf("started %d, failed %d; want 7 started and 5 (or 6 with one create in flight) failed", d.Started, d.FailedCreates)
	}
	if !strings.Contains(d.Stopped, "5 failed creates in a row") || len(d.CreateErrors) != densityErrors {
		t.Errorf("stopped %q, errors %q; want the stop reason and %d errors", d.Stopped, d.CreateErrors, densityErrors)
	}
	if !strings.Contains(d.CreateErrors[0], "with 7 up") {
		t.Errorf("first error %q, want how many were up", d.CreateErrors[0])
	}
	if len(f.live) != 0 {
		t.Errorf("%d left alive, want all killed", len(f.live))
	}
}

func TestRunDensityNoneStarts(t *testing.T) {
	f := newDensityFake()
	f.failFrom = 1
	if _, err := runDensity(context.Background(), f, densityOpts{n: 10, parallel: 2, maxFailsInRow: 3}); err == nil {
		t.Error("no sandbox started: got nil error, want one")
	}
}

// Ctrl-C during the creates: the run returns the cancellation and still
// kills every sandbox it started.
func TestRunDensityCancelled(t *testing.T) {
	f := newDensityFake()
	ctx, cancel := context.WithCancel(context.Background())
	o := densityOpts{n: 1000, parallel: 3, progress: func(string, ...any) {
		f.mu.Lock()
		n := f.n
		f.mu.Unlock()
		if n >= 100 {
			cancel()
		}
	}}
	d, err := runDensity(ctx, f, o)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("got %v, want context.Canceled", err)
	}
	if d.Started == 0 || d.Started == 1000 {
		t.Errorf("started %d, want some but not all", d.Started)
	}
	if len(f.live) != 0 {
		t.Errorf("%d left alive after Ctrl-C, want all killed", len(f.live))
	}
}
