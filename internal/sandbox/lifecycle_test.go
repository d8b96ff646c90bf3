package sandbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
)

// pausingRuntime is the fake runtime with pause and resume, counted; a
// resume takes resumeDelay, so that concurrent callers overlap.
type pausingRuntime struct {
	*fakeRuntime
	pauses, resumes atomic.Int32
	resumeDelay     time.Duration
}

func (p *pausingRuntime) Pause(context.Context, string) error { p.pauses.Add(1); return nil }
func (p *pausingRuntime) Resume(context.Context, string) error {
	time.Sleep(p.resumeDelay)
	p.resumes.Add(1)
	return nil
}

func lifecycleManager(t *testing.T) (*Manager, *pausingRuntime) {
	rt := &pausingRuntime{fakeRuntime: newFakeRuntime(), resumeDelay: 20 * time.Millisecond}
	return testManager(t, rt, 10), rt
}

// running adds a running sandbox with lc whose timer fires after d.
func running(t *testing.T, m *Manager, lc Lifecycle, d time.Duration) *entry {
	e, _ := addSandbox(t, m, StateRunning)
	e.mu.Lock()
	e.sb.Lifecycle, e.sb.Timeout, e.sb.EndAt = lc, time.Minute, time.Now().Add(d)
	m.armTimer(e)
	e.mu.Unlock()
	return e
}

func state(e *entry) State {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.sb.State
}

func TestTimeoutKillsOrPauses(t *testing.T) {
	m, rt := lifecycleManager(t)
	killed := running(t, m, Lifecycle{}, time.Millisecond)
	paused := running(t, m, Lifecycle{AutoPause: true}, time.Millisecond)
	eventually(t, "sandbox without autoPause not killed at its timeout", func() bool { return rt.calls(killed.sb.ID) == 1 })
	eventually(t, "sandbox with autoPause not paused at its timeout", func() bool { return state(paused) == StatePaused })
	if got := rt.pauses.Load(); got != 1 {
		t.Errorf("got %d runtime pauses, want 1", got)
	}
	if _, err := m.Get(paused.sb.ID); err != nil {
		t.Errorf("a sandbox paused at its timeout must stay listed: %v", err)
	}
	// Connect's resume gives it its create timeout (nothing was left).
	sb, err := m.Resume(context.Background(), paused.sb.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if left := time.Until(sb.EndAt); left < 50*time.Second {
		t.Errorf("after resume %v left, want about the create timeout (1m)", left)
	}
}

// A timeout pause racing a kill: one wins, the sandbox ends up killed or
// paused-then-killed, never paused after its kill, torn down once.
func TestTimeoutPauseRacesKill(t *testing.T) {
	m, rt := lifecycleManager(t)
	for range 50 {
		e := running(t, m, Lifecycle{AutoPause: true}, 0)
		id := e.sb.ID
		if err := m.Kill(context.Background(), id); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("kill: %v", err)
		}
		eventually(t, "killed sandbox not torn down", func() bool { return rt.calls(id) == 1 && dyingCount(m) == 0 })
		time.Sleep(time.Millisecond) // a late timer has run by now
		if _, err := m.Get(id); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("killed sandbox still there (%v), state %s", err, state(e))
		}
		if got := state(e); got != StateKilling {
			t.Fatalf("killed sandbox is %s, want killing", got)
		}
	}
}

// Connect racing the timeout pause: whichever order, connect ends with a
// running sandbox (it resumes what the timer paused), and a connect that
// extends first stops the pause.
func TestConnectRacesTimeoutPause(t *testing.T) {
	m, _ := lifecycleManager(t)
	for range 50 {
		e := running(t, m, Lifecycle{AutoPause: true}, time.Millisecond)
		id := e.sb.ID
		time.Sleep(time.Millisecond)
		// What the connect handler does: resume if paused, else extend,
		// and again if the state changed in between.
		var sb Sandbox
		var err error
		for range 3 {
			if sb, err = m.Get(id); err != nil {
				t.Fatal(err)
			}
			if sb.State == StatePaused {
				if sb, err = m.Resume(context.Background(), id, 0); errors.Is(err, errdefs.ErrConflict) {
					continue
				}
			} else {
				sb, err = m.Extend(id, time.Minute)
			}
			if err != nil {
				t.Fatal(err)
			}
			if sb.State == StateRunning {
				break
			}
		}
		if sb.State != StateRunning {
			t.Fatalf("after connect the sandbox is %s, want running", sb.State)
		}
		time.Sleep(2 * time.Millisecond)
		if got := state(e); got != StateRunning {
			t.Fatalf("a connected sandbox became %s: a stale timer paused it", got)
		}
	}
}

// 20 proxied requests to a paused sandbox with autoResume make one resume,
// and every one of them gets the running sandbox's address.
func TestAutoResumeOnce(t *testing.T) {
	m, rt := lifecycleManager(t)
	e := running(t, m, Lifecycle{AutoPause: true, AutoResume: true}, time.Hour)
	if _, err := m.Pause(context.Background(), e.sb.ID); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 20 {
		wg.Go(func() {
			if r, err := m.Resolve(e.sb.ID, 49983, nil); err != nil || r.Gone == nil || r.Addr == "" {
				errs <- fmt.Errorf("route %+v, err %v", r, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("request during auto-resume: %v", err)
	}
	if got := rt.resumes.Load(); got != 1 {
		t.Errorf("20 requests made %d resumes, want 1", got)
	}
	if got := state(e); got != StateRunning {
		t.Errorf("state %s after auto-resume, want running", got)
	}
}

// Without autoResume (or paused without memory) traffic does not resume
// a paused sandbox: the proxy gets "not found" (502 there).
func TestNoAutoResume(t *testing.T) {
	m, rt := lifecycleManager(t)
	plain := running(t, m, Lifecycle{AutoPause: true}, time.Hour)
	if _, err := m.Pause(context.Background(), plain.sb.ID); err != nil {
		t.Fatal(err)
	}
	filesOnly := running(t, m, Lifecycle{AutoPause: true, AutoResume: true}, time.Hour)
	filesOnly.mu.Lock()
	filesOnly.sb.State = StatePausedFiles
	filesOnly.mu.Unlock()
	for _, e := range []*entry{plain, filesOnly} {
		if _, err := m.Resolve(e.sb.ID, 49983, nil); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("traffic to a paused sandbox: %v, want not found", err)
		}
	}
	if got := rt.resumes.Load(); got != 0 {
		t.Errorf("got %d resumes, want none", got)
	}
}

// A request the proxy refuses (no traffic token) does not resume a
// paused sandbox: Resolve shows the route to check before waking it.
func TestResolveChecksBeforeWaking(t *testing.T) {
	m, rt := lifecycleManager(t)
	e := running(t, m, Lifecycle{AutoPause: true, AutoResume: true}, time.Hour)
	e.mu.Lock()
	e.sb.TrafficToken = "secret"
	e.mu.Unlock()
	if _, err := m.Pause(context.Background(), e.sb.ID); err != nil {
		t.Fatal(err)
	}
	refused := errors.New("no token")
	var seen Route
	if _, err := m.Resolve(e.sb.ID, 8080, func(r Route) error { seen = r; return refused }); err != refused {
		t.Fatalf("Resolve with a refusing check: got %v, want the check's error", err)
	}
	if seen.Token != "secret" || seen.State != StatePaused || seen.Addr != "" {
		t.Errorf("check saw %+v, want token secret, paused, no address", seen)
	}
	if got := rt.resumes.Load(); got != 0 {
		t.Errorf("a refused request made %d resumes, want none", got)
	}
	r, err := m.Resolve(e.sb.ID, 8080, func(Route) error { return nil })
	if err != nil || r.State != StateRunning || r.Addr == "" {
		t.Fatalf("Resolve with a passing check: %+v, %v; want the running sandbox's route", r, err)
	}
	e.mu.Lock()
	boot, gone := e.boot, e.gone
	e.mu.Unlock()
	if r.Boot != boot || r.Gone != (<-chan struct{})(gone) {
		t.Errorf("route of boot %d with another boot's gone channel (entry boot %d)", r.Boot, boot)
	}
}

func TestLifecycleChecks(t *testing.T) {
	l := DefaultLimits()
	for _, tt := range []struct {
		lc Lifecycle
		ok bool
	}{
		{Lifecycle{}, true},
		{Lifecycle{AutoPause: true, AutoResume: true}, true},
		{Lifecycle{AutoPause: true, DropMemory: true}, true},
		{Lifecycle{DropMemory: true}, false},
		{Lifecycle{AutoPause: true, DropMemory: true, AutoResume: true}, false},
	} {
		req := CreateRequest{Template: "t", Lifecycle: tt.lc}
		if err := l.check(&req); (err == nil) != tt.ok {
			t.Errorf("check(%+v) = %v, want ok %v", tt.lc, err, tt.ok)
		}
	}
}

// SetTimeout(0) runs the timeout action at once (E2B's set_timeout(0)): a
// running sandbox is killed or paused; a paused one is killed, unless its
// action is the pause it already had.
func TestSetTimeoutZeroActsNow(t *testing.T) {
	m, rt := lifecycleManager(t)
	killed := running(t, m, Lifecycle{}, time.Hour)
	paused := running(t, m, Lifecycle{AutoPause: true}, time.Hour)
	for _, e := range []*entry{killed, paused} {
		if _, err := m.SetTimeout(e.sb.ID, 0); err != nil {
			t.Fatalf("SetTimeout(%s, 0): %v", e.sb.ID, err)
		}
	}
	eventually(t, "sandbox without autoPause not killed by timeout 0", func() bool { return rt.calls(killed.sb.ID) == 1 })
	eventually(t, "sandbox with autoPause not paused by timeout 0", func() bool { return state(paused) == StatePaused })

	// Paused by its own timeout action: timeout 0 changes nothing.
	if _, err := m.SetTimeout(paused.sb.ID, 0); err != nil {
		t.Fatalf("SetTimeout(0) of a sandbox paused by it: %v", err)
	}
	if got := state(paused); got != StatePaused {
		t.Errorf("an autoPause sandbox paused again by timeout 0 is %s, want paused", got)
	}
	// Paused by a client, killed at its timeout: timeout 0 kills it.
	e := running(t, m, Lifecycle{}, time.Hour)
	if _, err := m.Pause(context.Background(), e.sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := m.SetTimeout(e.sb.ID, 0); err != nil {
		t.Fatalf("SetTimeout(0) of a paused sandbox: %v", err)
	}
	if _, err := m.Get(e.sb.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("paused sandbox after timeout 0: Get = %v, want not found (killed)", err)
	}
	if _, err := m.SetTimeout(paused.sb.ID, -time.Second); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("SetTimeout(-1s) = %v, want ErrInvalid", err)
	}
}
