package sandbox

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
)

// TestRegistryEndIsOneStep: while sandboxes are killed concurrently, every
// one is counted exactly once (live or dying) at every moment, so that
// admission never sees room a sandbox being torn down still holds; and a
// look-up of a killed one finds it or how it ended, never the bare
// "does not exist" of an ID it never had. Racing adds and removes of
// other sandboxes must not disturb either.
func TestRegistryEndIsOneStep(t *testing.T) {
	const n = 64
	var r registry
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("sb-%02d", i)
		r.add(&entry{sb: Sandbox{ID: ids[i]}})
	}
	var stop atomic.Bool
	var watchers sync.WaitGroup
	errs := make(chan error, 8)
	report := func(err error) {
		select {
		case errs <- err:
		default:
		}
	}
	// Counting: the n sandboxes are live or dying, never in neither or
	// both (sandboxes added and removed by churn below are "x-" ones and
	// come and go in pairs, so they are left out of this count).
	watchers.Add(1)
	go func() {
		defer watchers.Done()
		for !stop.Load() {
			listed, dying := r.ids(true)
			got := 0
			for _, id := range append(listed, dying...) {
				if strings.HasPrefix(id, "sb-") {
					got++
				}
			}
			if got != n {
				report(fmt.Errorf("counted %d of the %d sandboxes (live %d, dying %d), want each once", got, n, len(listed), len(dying)))
				return
			}
		}
	}()
	// Looking up: a killed sandbox says how it ended.
	watchers.Add(1)
	go func() {
		defer watchers.Done()
		for !stop.Load() {
			for _, id := range ids {
				if _, err := r.lookup(id); err != nil && !strings.Contains(err.Error(), "killed at") {
					report(fmt.Errorf("look-up of %s while it is killed: %v, want it or how it ended", id, err))
					return
				}
			}
		}
	}()
	// Churn: other sandboxes are listed, unlisted and admitted.
	watchers.Add(1)
	go func() {
		defer watchers.Done()
		for i := 0; !stop.Load(); i++ {
			id := fmt.Sprintf("x-%d", i)
			r.add(&entry{sb: Sandbox{ID: id}})
			r.remove(id)
			if err := r.admit(1 << 20); err == nil {
				r.inflight.Done()
			}
		}
	}()
	var killers sync.WaitGroup
	now := time.Now()
	for _, id := range ids {
		killers.Add(1)
		go func() {
			defer killers.Done()
			if r.end(&teardown{sb: Sandbox{ID: id}}, endNote{cause: EndKilled, at: now}) {
				r.teardowns.Done()
			}
		}()
	}
	killers.Wait()
	time.Sleep(10 * time.Millisecond) // let the watchers look at the end state
	stop.Store(true)
	watchers.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if live, dying := r.count(); live != 0 || dying != n {
		t.Errorf("after the kills: %d live, %d dying; want 0 and %d", live, dying, n)
	}
	for _, id := range ids {
		r.tornDown(id)
	}
	if live, dying := r.count(); live != 0 || dying != 0 {
		t.Errorf("after the teardowns: %d live, %d dying; want none", live, dying)
	}
}

// TestRegistryClosedAdmitsNothing: after close, no create is admitted and
// a teardown is counted but gets no goroutine (Shutdown waits for none).
func TestRegistryClosedAdmitsNothing(t *testing.T) {
	var r registry
	r.add(&entry{sb: Sandbox{ID: "a"}})
	if err := r.admit(1); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("admit with the one place taken: %v, want resource exhausted", err)
	}
	if got := r.close(); len(got) != 1 {
		t.Fatalf("close returned %d entries, want 1", len(got))
	}
	if err := r.admit(10); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("admit after close: %v, want unavailable", err)
	}
	if r.end(&teardown{sb: Sandbox{ID: "a"}}, endNote{}) {
		t.Fatal("a teardown after close may run on a goroutine; want none")
	}
	if !r.holds("a") || r.listed("a") {
		t.Fatal("after its end: want a counted as dying, not listed")
	}
}
