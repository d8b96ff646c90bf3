package gvisorgo

// Tests here need neither root nor gVisor.

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// TestDispatchPriority: a worker that becomes free goes to a waiting create
// or restore before any waiting prepare, and to requests of one priority in
// order of arrival.
func TestDispatchPriority(t *testing.T) {
	var d dispatch
	closed := make(chan struct{})
	ctx := context.Background()
	got := make(chan string, 4)
	wait := func(name string, prio int) {
		w, err := d.get(ctx, closed, prio)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			return
		}
		got <- name
		d.put(w)
	}
	// Queue a background request, then two urgent ones, while no worker
	// is idle; each queues before the next starts.
	var wg sync.WaitGroup
	for i, r := range []struct {
		name string
		prio int
	}{{"prepare", background}, {"restore1", urgent}, {"restore2", urgent}} {
		wg.Go(func() { wait(r.name, r.prio) })
		waitQueued(t, &d, r.prio, max(i, 1))
	}
	d.put(&proc{}) // one worker for all three, one after the other
	wg.Wait()
	close(got)
	var order []string
	for n := range got {
		order = append(order, n)
	}
	want := []string{"restore1", "restore2", "prepare"}
	if len(order) != len(want) {
		t.Fatalf("served %v, want %v", order, want)
	}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("served %v, want %v", order, want)
		}
	}
}

// waitQueued waits until n requests of prio wait in d.
func waitQueued(t *testing.T, d *dispatch, prio, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		d.mu.Lock()
		got := len(d.waiting[prio])
		d.mu.Unlock()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("request did not queue")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestDispatchCancelRace: requests that give up (context cancelled, pool
// closed) while workers are handed out never lose a worker. Run it with
// -race.
func TestDispatchCancelRace(t *testing.T) {
	var d dispatch
	closed := make(chan struct{})
	const workers = 3
	for range workers {
		d.put(&proc{})
	}
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Go(func() {
			for j := range 200 {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration((i+j)%3)*10*time.Microsecond)
				w, err := d.get(ctx, closed, (i+j)%priorities)
				cancel()
				if err != nil {
					if !errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("get: %v", err)
					}
					continue
				}
				d.put(w)
			}
		})
	}
	wg.Wait()
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.idle) != workers {
		t.Errorf("%d idle workers after the race, want %d", len(d.idle), workers)
	}
	for prio, q := range d.waiting {
		if len(q) != 0 {
			t.Errorf("%d requests of priority %d still queued", len(q), prio)
		}
	}
}

// TestDispatchClosed: a request waiting for a worker fails once the pool
// closes.
func TestDispatchClosed(t *testing.T) {
	var d dispatch
	closed := make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		_, err := d.get(context.Background(), closed, urgent)
		errc <- err
	}()
	waitQueued(t, &d, urgent, 1)
	close(closed)
	if err := <-errc; err == nil {
		t.Fatal("get returned a worker from a closed pool")
	}
}
