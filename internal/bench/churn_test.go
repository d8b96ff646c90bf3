package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestPerSecond(t *testing.T) {
	tests := []struct {
		cycles  int
		elapsed time.Duration
		want    float64
	}{
		{400, 10 * time.Second, 40},
		{5, 2500 * time.Millisecond, 2},
		{0, time.Second, 0},
		{10, 0, 0},
	}
	for _, tt := range tests {
		if got := perSecond(tt.cycles, tt.elapsed); got != tt.want {
			t.Errorf("perSecond(%d, %v) = %v, want %v", tt.cycles, tt.elapsed, got, tt.want)
		}
	}
}

// churnFake counts creates and kills, and fails every failEvery-th create
// or the kill of every killFailEvery-th container.
type churnFake struct {
	mu            sync.Mutex
	n             int
	live          map[string]bool
	maxLive       int
	failEvery     int
	killFailEvery int
	killed        atomic.Int64
}

func (f *churnFake) create(context.Context) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	if f.failEvery > 0 && f.n%f.failEvery == 0 {
		return "", errors.New("create failed")
	}
	id := fmt.Sprint(f.n)
	f.live[id] = true
	f.maxLive = max(f.maxLive, len(f.live))
	return id, nil
}

func (f *churnFake) kill(_ context.Context, id string) error {
	time.Sleep(time.Millisecond) // let the workers overlap
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.live, id)
	f.killed.Add(1)
	var n int
	fmt.Sscan(id, &n)
	if f.killFailEvery > 0 && n%f.killFailEvery == 0 {
		return errors.New("kill failed")
	}
	return nil
}

func TestChurn(t *testing.T) {
	f := &churnFake{live: map[string]bool{}, failEvery: 5}
	th, err := churn(context.Background(), f, 4, 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if th.Cycles == 0 || th.Failed == 0 || th.FirstError == "" {
		t.Errorf("churn = %+v, want successes and counted failures", th)
	}
	if th.Cycles+th.Failed != f.n {
		t.Errorf("cycles %d + failed %d = %d, want every create (%d) counted", th.Cycles, th.Failed, th.Cycles+th.Failed, f.n)
	}
	if len(f.live) != 0 {
		t.Errorf("%d containers left alive, want 0", len(f.live))
	}
	if f.maxLive > 4 {
		t.Errorf("up to %d containers at once, want at most 4 in flight", f.maxLive)
	}
	if want := perSecond(th.Cycles, time.Duration(th.Seconds*float64(time.Second))); th.PerSecond < want*0.99 || th.PerSecond > want*1.01 {
		t.Errorf("PerSecond = %v, want cycles/seconds = %v", th.PerSecond, want)
	}
	if th.Seconds < 0.05 {
		t.Errorf("Seconds = %v, want at least the 50 ms duration", th.Seconds)
	}
}

func TestChurnAllFail(t *testing.T) {
	f := &churnFake{live: map[string]bool{}, failEvery: 1}
	if _, err := churn(context.Background(), f, 2, 10*time.Millisecond); err == nil {
		t.Error("every cycle failed: got nil error, want one")
	}
}

func TestChurnCancelled(t *testing.T) {
	f := &churnFake{live: map[string]bool{}}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := churn(ctx, f, 2, time.Second); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled churn: got %v, want context.Canceled", err)
	}
}

func TestChurnCycleKillFails(t *testing.T) {
	f := &churnFake{live: map[string]bool{}, killFailEvery: 1}
	if err := churnCycle(context.Background(), f); err == nil {
		t.Error("failed kill: got nil error, want one")
	}
}
