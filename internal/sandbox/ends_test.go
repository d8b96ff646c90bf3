package sandbox

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/runtime"
)

// endLog records what an EndObserver is told.
type endLog struct {
	mu  sync.Mutex
	got map[string][]string // sandbox ID → causes told
}

func observeEnds(m *Manager) *endLog {
	l := &endLog{got: map[string][]string{}}
	m.ObserveEnds(func(cause string, sb Sandbox) {
		l.mu.Lock()
		l.got[sb.ID] = append(l.got[sb.ID], cause)
		l.mu.Unlock()
	})
	return l
}

func (l *endLog) of(id string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.got[id]...)
}

func (l *endLog) total() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, c := range l.got {
		n += len(c)
	}
	return n
}

// oomRuntime is the fake runtime whose sandboxes' memory cgroups report
// OOM kills.
type oomRuntime struct {
	*fakeRuntime
	oomKills int64
}

func (o *oomRuntime) Stats(context.Context, string) (runtime.Stats, error) {
	return runtime.Stats{MemLimit: 512 << 20, OOMKills: o.oomKills}, nil
}

// TestEndsToldOnceByCause: each sandbox that ends is told to the observer
// exactly once, with its cause: a kill (however many race), its timeout,
// a death with and without the host's OOM killer; spares of the hot pool
// that no client had, and kills of sandboxes that do not exist, are not
// ends.
func TestEndsToldOnceByCause(t *testing.T) {
	rt := &oomRuntime{fakeRuntime: newFakeRuntime()}
	m := testManager(t, rt, 20)
	log := observeEnds(m)
	ctx := context.Background()

	killed, _ := addSandbox(t, m, StateRunning)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() { defer wg.Done(); m.Kill(ctx, killed.sb.ID) }()
	}
	wg.Wait()
	if got := log.of(killed.sb.ID); len(got) != 1 || got[0] != EndKilled {
		t.Errorf("8 racing kills: got ends %v, want [killed]", got)
	}

	timedOut := running(t, m, Lifecycle{}, time.Millisecond)
	eventually(t, "sandbox not killed at its timeout", func() bool { return len(log.of(timedOut.sb.ID)) > 0 })
	m.Kill(ctx, timedOut.sb.ID)

	die := func(st State, oomKills int64) string {
		e, _ := addSandbox(t, m, st)
		rt.mu.Lock()
		rt.oomKills = oomKills
		rt.mu.Unlock()
		m.watch(e)
		rt.mu.Lock()
		close(rt.exited[e.sb.ID])
		rt.mu.Unlock()
		eventually(t, "dead sandbox not torn down", func() bool { return rt.calls(e.sb.ID) == 1 })
		return e.sb.ID
	}
	lost, oom := die(StateRunning, 0), die(StatePaused, 1)
	if _, err := m.Get(oom); !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "ran out of its memory limit (512 MiB)") || EndCause(err) != EndOOM {
		t.Errorf("get after an OOM death: %v (end cause %q), want not found saying it ran out of its memory limit (512 MiB), cause oom", err, EndCause(err))
	}
	if _, err := m.Get(lost); !errors.Is(err, ErrLost) || EndCause(err) != EndLost || !strings.Contains(err.Error(), "not for memory") {
		t.Errorf("get after a death: %v (end cause %q), want lost saying not for memory, cause lost", err, EndCause(err))
	}
	pooledDied := die(StatePooled, 0)
	pooled, _ := addSandbox(t, m, StatePooled)
	m.Kill(ctx, pooled.sb.ID)
	if err := m.Kill(ctx, "sb-does-not-exist"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("kill of an unknown sandbox: got %v, want not found", err)
	}

	for _, tc := range []struct {
		what, id string
		want     []string
	}{
		{"timed out", timedOut.sb.ID, []string{EndTimeout}},
		{"died", lost, []string{EndLost}},
		{"died out of memory", oom, []string{EndOOM}},
		{"pooled spare that died", pooledDied, nil},
		{"pooled spare killed", pooled.sb.ID, nil},
	} {
		if got := log.of(tc.id); strings.Join(got, ",") != strings.Join(tc.want, ",") {
			t.Errorf("%s: got ends %v, want %v", tc.what, got, tc.want)
		}
	}
	if n := log.total(); n != 4 {
		t.Errorf("got %d ends told, want 4", n)
	}
}

// TestEndsBeforeObserverAreKept: ends before the observer is set (Recover
// finds lost sandboxes before the server wires its metrics) are told when
// it is.
func TestEndsBeforeObserverAreKept(t *testing.T) {
	m := testManager(t, newFakeRuntime(), 10)
	m.markLost(context.Background(), Sandbox{ID: "sb-lost-before", Metadata: map[string]string{"run": "r1"}}, "its container was gone after a restart")
	var got []string
	m.ObserveEnds(func(cause string, sb Sandbox) { got = append(got, cause+" "+sb.ID+" "+sb.Metadata["run"]) })
	if want := "lost sb-lost-before r1"; len(got) != 1 || got[0] != want {
		t.Errorf("got ends %q, want [%q]", got, want)
	}
}
