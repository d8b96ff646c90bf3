package lifecycletest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/runtime"
	"github.com/agentenv/agentenv/internal/sandbox"
)

func TestUnprivilegedCreateKill(t *testing.T) {
	x := newHost(t)
	sb := x.create(sandbox.CreateRequest{})
	if err := health(sb); err != nil {
		t.Fatalf("envd of a new sandbox: %v", err)
	}
	if got := x.fakeState(sb.ID); got != runtime.StatusRunning {
		t.Fatalf("runtime state %s, want running", got)
	}
	if err := x.m.Kill(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	eventually(t, "runtime forgets the killed sandbox", func() bool { return x.fakeState(sb.ID) == runtime.StatusUnknown })
	if _, err := x.m.Get(sb.ID); !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "killed") {
		t.Errorf("get after kill: %v, want not found saying it was killed", err)
	}
}

// The timeout kills at its deadline and not before, on the injected clock.
func TestUnprivilegedTimeoutKills(t *testing.T) {
	x := newHost(t)
	sb := x.create(sandbox.CreateRequest{Timeout: time.Hour})
	x.clock.Advance(59 * time.Minute)
	time.Sleep(20 * time.Millisecond)
	if got := x.state(sb.ID); got != "running" {
		t.Fatalf("59 minutes into a 1-hour timeout: %s, want running", got)
	}
	// Create stamps its deadline from the wall clock (a little after the
	// fake clock started): a minute covers the difference.
	x.clock.Advance(2 * time.Minute)
	eventually(t, "timed-out sandbox gone", func() bool { return x.state(sb.ID) == "gone" })
	if _, err := x.m.Get(sb.ID); err == nil || !strings.Contains(err.Error(), "timed out") {
		t.Errorf("get after the timeout: %v, want it to say it timed out", err)
	}
	eventually(t, "runtime forgets the timed-out sandbox", func() bool { return x.fakeState(sb.ID) == runtime.StatusUnknown })
}

// With autoPause the timeout pauses (SIGSTOP), the paused sandbox's clock
// stands still, and a resume gives it its create timeout again.
func TestUnprivilegedTimeoutAutoPauses(t *testing.T) {
	x := newHost(t)
	sb := x.create(sandbox.CreateRequest{Timeout: 10 * time.Minute, Lifecycle: sandbox.Lifecycle{AutoPause: true}})
	x.clock.Advance(12 * time.Minute)
	eventually(t, "paused at its timeout", func() bool { return x.state(sb.ID) == "paused" })
	if got := x.fakeState(sb.ID); got != runtime.StatusPaused {
		t.Fatalf("runtime state %s, want paused", got)
	}
	x.clock.Advance(24 * time.Hour)
	time.Sleep(20 * time.Millisecond)
	if got := x.state(sb.ID); got != "paused" {
		t.Fatalf("a day after its pause: %s, want paused (its clock stops)", got)
	}
	got, err := x.m.Resume(t.Context(), sb.ID, 0)
	if err != nil {
		t.Fatalf("resume: %v", err)
	}
	if left := got.EndAt.Sub(x.clock.Now()); left != 10*time.Minute {
		t.Errorf("after resume %v left, want the create timeout 10m0s", left)
	}
	if err := health(got); err != nil {
		t.Errorf("envd after resume: %v", err)
	}
	x.clock.Advance(11 * time.Minute)
	eventually(t, "paused again at its next timeout", func() bool { return x.state(sb.ID) == "paused" })
}

// SetTimeout re-arms the timer: the old deadline no longer counts;
// Extend never shortens.
func TestUnprivilegedSetTimeoutRearms(t *testing.T) {
	x := newHost(t)
	sb := x.create(sandbox.CreateRequest{Timeout: 2 * time.Minute})
	if _, err := x.m.SetTimeout(sb.ID, 30*time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := x.m.Extend(sb.ID, time.Minute); err != nil {
		t.Fatal(err)
	}
	x.clock.Advance(5 * time.Minute)
	time.Sleep(20 * time.Millisecond)
	if got := x.state(sb.ID); got != "running" {
		t.Fatalf("past the old deadline: %s, want running", got)
	}
	x.clock.Advance(26 * time.Minute)
	eventually(t, "gone at the new deadline", func() bool { return x.state(sb.ID) == "gone" })
	if n := x.clock.Pending(); n != 0 {
		t.Errorf("%d timers left after the only sandbox ended", n)
	}
}

// A sandbox whose process dies on its own is torn down and remembered as
// lost, not listed as running.
func TestUnprivilegedDeathIsNoticed(t *testing.T) {
	x := newHost(t)
	sb := x.create(sandbox.CreateRequest{})
	syscall.Kill(-x.pid(sb.ID), syscall.SIGKILL)
	eventually(t, "dead sandbox gone", func() bool { return x.state(sb.ID) == "gone" })
	if _, err := x.m.Get(sb.ID); err == nil || !strings.Contains(err.Error(), "lost") {
		t.Errorf("get after its death: %v, want it to say it was lost", err)
	}
}

// pid is the process of a fake sandbox.
func (x *host) pid(id string) int {
	x.t.Helper()
	b, err := os.ReadFile(filepath.Join(x.dir, "fake", id, "pid"))
	if err != nil {
		x.t.Fatal(err)
	}
	var pid, start int
	if _, err := fmt.Sscanf(string(b), "%d %d", &pid, &start); err != nil || pid <= 0 {
		x.t.Fatalf("pid file %q: %v", b, err)
	}
	return pid
}

// Many goroutines pause, resume, kill, extend and read the same sandboxes
// while the clock runs their timeouts: every operation succeeds or fails
// with a clean error, and at the end the manager's state is the runtime's.
func TestUnprivilegedPauseResumeKillRace(t *testing.T) {
	x := newHost(t)
	const boxes, workers = 4, 6
	var ids []string
	for range boxes {
		ids = append(ids, x.create(sandbox.CreateRequest{Timeout: 10 * time.Minute,
			Lifecycle: sandbox.Lifecycle{AutoPause: rand.IntN(2) == 0}}).ID)
	}
	ctx := t.Context()
	stop := time.Now().Add(1500 * time.Millisecond)
	var wg sync.WaitGroup
	var mu sync.Mutex
	unexpected := map[string]int{}
	for w := range workers * boxes {
		id := ids[w%boxes]
		wg.Go(func() {
			for time.Now().Before(stop) {
				var err error
				switch n := rand.IntN(20); {
				case n < 7:
					_, err = x.m.Pause(ctx, id)
				case n < 14:
					_, err = x.m.Resume(ctx, id, 0)
				case n < 16:
					_, err = x.m.SetTimeout(id, time.Duration(1+rand.IntN(20))*time.Minute)
				case n < 18:
					_, err = x.m.Get(id)
				case n < 19:
					x.clock.Advance(time.Minute)
				default:
					if rand.IntN(10) == 0 {
						err = x.m.Kill(ctx, id)
					}
				}
				// Conflicts (wrong state) and not-found (killed) are the
				// answers a race may give; anything else is a bug.
				if err != nil && !errors.Is(err, errdefs.ErrConflict) && !errors.Is(err, errdefs.ErrNotFound) {
					mu.Lock()
					unexpected[err.Error()]++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	for msg, n := range unexpected {
		t.Errorf("%d× unexpected error: %s", n, msg)
	}
	// Let pending teardowns and timer callbacks settle.
	for _, id := range ids {
		eventually(t, "state settles", func() bool {
			s := x.state(id)
			return s == "running" || s == "paused" || s == "gone"
		})
		eventually(t, "runtime agrees with the manager on "+id, func() bool {
			return x.fakeState(id) == runtimeStatus[x.state(id)]
		})
		if sb, err := x.m.Get(id); err == nil && sb.State == sandbox.StateRunning {
			if err := health(sb); err != nil {
				t.Errorf("running sandbox %s does not answer: %v", id, err)
			}
		}
	}
}

// Creates race kills of whatever is listed, and kills of their own
// sandbox right after the create answers: no create may leave a process,
// a runtime sandbox or a listed sandbox behind (checked at cleanup).
func TestUnprivilegedCreatesRaceKills(t *testing.T) {
	x := newHost(t)
	ctx := t.Context()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	stop := time.Now().Add(1500 * time.Millisecond)
	for range 4 {
		wg.Go(func() {
			for time.Now().Before(stop) {
				sb, err := x.m.Create(ctx, sandbox.CreateRequest{Template: "busybox", Timeout: time.Minute})
				if err != nil {
					fail(err)
					continue
				}
				if rand.IntN(2) == 0 {
					if err := x.m.Kill(ctx, sb.ID); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
						fail(err)
					}
				}
			}
		})
	}
	for range 2 {
		wg.Go(func() {
			for time.Now().Before(stop) {
				for _, sb := range x.m.List(sandbox.Filter{}) {
					if err := x.m.Kill(ctx, sb.ID); err != nil && !errors.Is(err, errdefs.ErrNotFound) && !errors.Is(err, errdefs.ErrConflict) {
						fail(err)
					}
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		t.Errorf("unexpected: %v", err)
	}
	for _, sb := range x.m.List(sandbox.Filter{}) {
		if err := health(sb); err != nil {
			t.Errorf("listed sandbox %s (%s) does not answer: %v", sb.ID, sb.State, err)
		}
	}
}

// runtimeStatus is the runtime's status for each state of the manager's.
var runtimeStatus = map[string]runtime.Status{"running": runtime.StatusRunning, "paused": runtime.StatusPaused, "gone": runtime.StatusUnknown}

// autoPause without memory (autoPauseMemory: false): the timeout saves
// the sandbox's files and stops it; a resume boots it again with them.
func TestUnprivilegedTimeoutPausesWithoutMemory(t *testing.T) {
	x := newHost(t)
	sb := x.create(sandbox.CreateRequest{Timeout: 10 * time.Minute, Lifecycle: sandbox.Lifecycle{AutoPause: true, DropMemory: true}})
	// The fake sandbox's whole filesystem is its work directory.
	work := filepath.Join(x.dir, "sandboxes", sb.ID, "root")
	if err := os.WriteFile(filepath.Join(work, "kept"), []byte("yes"), 0o600); err != nil {
		t.Fatal(err)
	}
	x.clock.Advance(11 * time.Minute)
	eventually(t, "paused without memory at its timeout", func() bool { return x.state(sb.ID) == string(sandbox.StatePausedFiles) })
	if st := x.fakeState(sb.ID); st != runtime.StatusUnknown {
		t.Errorf("runtime state of a sandbox paused without memory: %s, want unknown (stopped)", st)
	}
	os.Remove(filepath.Join(work, "kept"))
	res, err := x.m.Resume(t.Context(), sb.ID, 0)
	if err != nil {
		t.Fatalf("resume without memory: %v", err)
	}
	if err := health(res); err != nil {
		t.Errorf("envd after the reboot: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(work, "kept")); err != nil || string(b) != "yes" {
		t.Errorf("file written before the pause: %q, %v; want it restored", b, err)
	}
}
