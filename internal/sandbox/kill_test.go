package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/netns"
	"github.com/agentenv/agentenv/internal/runtime"
	"github.com/agentenv/agentenv/internal/template"
)

// fakeRuntime counts Destroy calls and runs destroy (if set) for each.
type fakeRuntime struct {
	mu       sync.Mutex
	destroys map[string]int
	destroy  func(id string, call int) error
	exited   map[string]chan struct{}
	list     []string
}

func newFakeRuntime() *fakeRuntime {
	return &fakeRuntime{destroys: map[string]int{}, exited: map[string]chan struct{}{}}
}

func (f *fakeRuntime) Create(context.Context, runtime.Spec) error { return nil }
func (f *fakeRuntime) State(context.Context, string) (runtime.Status, error) {
	return runtime.StatusRunning, nil
}
func (f *fakeRuntime) Version() string { return "fake" }

// List returns the IDs of list not destroyed yet.
func (f *fakeRuntime) List(context.Context) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, id := range f.list {
		if f.destroys[id] == 0 {
			out = append(out, id)
		}
	}
	return out, nil
}

func (f *fakeRuntime) Destroy(_ context.Context, id string) error {
	f.mu.Lock()
	f.destroys[id]++
	n, destroy := f.destroys[id], f.destroy
	f.mu.Unlock()
	if destroy != nil {
		return destroy(id, n)
	}
	return nil
}

func (f *fakeRuntime) Exited(_ context.Context, id string) (<-chan struct{}, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ch := make(chan struct{})
	f.exited[id] = ch
	return ch, nil
}

func (f *fakeRuntime) calls(id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.destroys[id]
}

var _ runtime.Watcher = (*fakeRuntime)(nil)

func testManager(t *testing.T, rt runtime.Runtime, max int) *Manager {
	t.Helper()
	l := DefaultLimits()
	l.MaxSandboxes = max
	m, err := New(Deps{Dir: t.TempDir(), Runtime: rt, Limits: l, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	m.reap.retryBase = time.Millisecond
	return m
}

// addSandbox registers a sandbox in state st as create would, with a
// release that counts its calls.
func addSandbox(t *testing.T, m *Manager, st State) (*entry, *atomic.Int32) {
	t.Helper()
	id := newID()
	if err := os.MkdirAll(m.rec.dir(id), 0o700); err != nil {
		t.Fatal(err)
	}
	released := new(atomic.Int32)
	e := newEntry(Sandbox{ID: id, State: st, EndAt: time.Now().Add(time.Hour)}, func() { released.Add(1) })
	if err := m.rec.write(e.sb); err != nil {
		t.Fatal(err)
	}
	m.reg.add(e)
	return e, released
}

// eventually polls cond until it holds or 10 s have passed.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second) // a safety net on a loaded host
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after 30s: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func dyingCount(m *Manager) int {
	_, dying := m.reg.count()
	return dying
}

func TestKillAnswersBeforeTeardown(t *testing.T) {
	rt := newFakeRuntime()
	unblock := make(chan struct{})
	rt.destroy = func(string, int) error { <-unblock; return nil }
	m := testManager(t, rt, 1)
	e, released := addSandbox(t, m, StateRunning)
	id := e.sb.ID

	done := make(chan error, 1)
	go func() { done <- m.Kill(context.Background(), id) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("kill: %v", err)
		}
	case <-time.After(5 * time.Second):
		close(unblock)
		t.Fatal("kill waited for the teardown")
	}
	if got := readState(t, m.d.Dir, id); got != StateKilling {
		t.Errorf("record while tearing down: got state %s, want %s (for recovery)", got, StateKilling)
	}
	select {
	case <-e.gone:
	default:
		t.Error("the proxy was not told the sandbox is gone")
	}
	if _, err := m.Get(id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("get after kill: got %v, want not found", err)
	}
	if got := m.List(Filter{}); len(got) != 0 {
		t.Errorf("list after kill: got %v, want nothing", got)
	}
	if err := m.Kill(context.Background(), id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("second kill: got %v, want not found", err)
	}
	// Still holding host resources: it counts against MaxSandboxes.
	if err := m.reg.admit(m.d.Limits.MaxSandboxes); !errors.Is(err, errdefs.ErrResourceExhausted) {
		if err == nil {
			m.reg.inflight.Done()
		}
		t.Errorf("admit while the only slot is being torn down: got %v, want resource exhausted", err)
	}
	if n := released.Load(); n != 0 {
		t.Errorf("template released %d times before the teardown ended, want 0", n)
	}

	close(unblock)
	eventually(t, "teardown still pending", func() bool { return dyingCount(m) == 0 })
	if n := released.Load(); n != 1 {
		t.Errorf("template released %d times, want once", n)
	}
	if _, err := os.Stat(m.rec.dir(id)); !os.IsNotExist(err) {
		t.Errorf("sandbox directory after teardown: %v, want it removed", err)
	}
	if err := m.reg.admit(m.d.Limits.MaxSandboxes); err != nil {
		t.Errorf("admit after the teardown: %v", err)
	} else {
		m.reg.inflight.Done()
	}
}

func TestKillRefusesCreating(t *testing.T) {
	m := testManager(t, newFakeRuntime(), 10)
	e, _ := addSandbox(t, m, StateCreating)
	if err := m.Kill(context.Background(), e.sb.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("kill while creating: got %v, want conflict", err)
	}
}

func TestTeardownRetriesUntilItSucceeds(t *testing.T) {
	rt := newFakeRuntime()
	rt.destroy = func(_ string, call int) error {
		if call <= 3 {
			return fmt.Errorf("device busy (call %d)", call)
		}
		return nil
	}
	m := testManager(t, rt, 10)
	e, released := addSandbox(t, m, StateRunning)
	if err := m.Kill(context.Background(), e.sb.ID); err != nil {
		t.Fatal(err)
	}
	eventually(t, "failing teardown never finished", func() bool { return dyingCount(m) == 0 })
	if got := rt.calls(e.sb.ID); got != 4 {
		t.Errorf("destroy called %d times, want 4 (3 failures, then success)", got)
	}
	if n := released.Load(); n != 1 {
		t.Errorf("template released %d times, want once", n)
	}
	if _, err := os.Stat(m.rec.dir(e.sb.ID)); !os.IsNotExist(err) {
		t.Errorf("sandbox directory: %v, want it removed", err)
	}
}

// TestShutdownLeavesFailingTeardownToRecovery: a teardown that keeps
// failing does not hold Shutdown for ever; its record says killing, and the
// next start finishes the job without a tombstone (it was killed on
// purpose).
func TestShutdownLeavesFailingTeardownToRecovery(t *testing.T) {
	rt := newFakeRuntime()
	rt.destroy = func(string, int) error { return errors.New("runtime down") }
	m := testManager(t, rt, 10)
	m.reap.grace = 20 * time.Millisecond
	e, released := addSandbox(t, m, StateRunning)
	id := e.sb.ID
	if err := m.Kill(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	m.Shutdown()
	if n := released.Load(); n != 0 {
		t.Errorf("template released %d times though the teardown never succeeded", n)
	}
	if got := readState(t, m.d.Dir, id); got != StateKilling {
		t.Fatalf("record after shutdown: state %s, want %s", got, StateKilling)
	}

	rt2 := newFakeRuntime()
	rt2.list = []string{id}
	m2 := recoveryManager(t, m.d.Dir, rt2)
	adopted, lost, err := m2.Recover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(adopted)+len(lost) != 0 {
		t.Errorf("recover: adopted %v, lost %v; want neither (it was being killed)", adopted, lost)
	}
	if got := rt2.calls(id); got != 1 {
		t.Errorf("recovery destroyed the container %d times, want once", got)
	}
	if _, err := os.Stat(m2.rec.dir(id)); !os.IsNotExist(err) {
		t.Errorf("sandbox directory after recovery: %v, want it removed", err)
	}
	if _, err := m2.Get(id); err == nil || strings.Contains(err.Error(), "lost") {
		t.Errorf("get after recovery: %v, want a plain not found", err)
	}
}

// recoveryManager is a manager over dir with just enough of the host
// (network and templates) for Recover.
func recoveryManager(t *testing.T, dir string, rt runtime.Runtime) *Manager {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	nets, err := netns.NewManager("10.125.0.0/24", "ut")
	if err != nil {
		t.Fatal(err)
	}
	envd := filepath.Join(t.TempDir(), "envd")
	os.WriteFile(envd, []byte("envd"), 0o755)
	tpl, err := template.Open(t.TempDir(), envd, log)
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(Deps{Dir: dir, Runtime: rt, Net: nets, Slots: netns.NewPool(nets, 0, log), Templates: tpl,
		Limits: DefaultLimits(), Log: log})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestDeathTearsDownWithReason: a sandbox that dies on its own (running or
// waiting in the hot pool) is torn down and Get says why.
func TestDeathTearsDownWithReason(t *testing.T) {
	for _, st := range []State{StateRunning, StatePooled, StatePaused} {
		t.Run(string(st), func(t *testing.T) {
			rt := newFakeRuntime()
			m := testManager(t, rt, 10)
			e, released := addSandbox(t, m, st)
			id := e.sb.ID
			m.watch(e)
			rt.mu.Lock()
			close(rt.exited[id])
			rt.mu.Unlock()
			eventually(t, "dead sandbox not torn down", func() bool { return rt.calls(id) == 1 && dyingCount(m) == 0 })
			if _, err := m.Get(id); !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "stopped unexpectedly") {
				t.Errorf("get after death: %v, want not found saying it stopped unexpectedly", err)
			}
			if n := released.Load(); n != 1 {
				t.Errorf("template released %d times, want once", n)
			}
		})
	}
}

// TestConcurrentKills kills 64 sandboxes from 16 goroutines while others
// list, get and are admitted; every sandbox is destroyed and released once.
func TestConcurrentKills(t *testing.T) {
	rt := newFakeRuntime()
	rt.destroy = func(_ string, call int) error {
		time.Sleep(time.Millisecond)
		if call == 1 && time.Now().UnixNano()%3 == 0 {
			return errors.New("transient")
		}
		return nil
	}
	const n = 64
	m := testManager(t, rt, n)
	entries := make([]*entry, n)
	rels := make([]*atomic.Int32, n)
	for i := range n {
		entries[i], rels[i] = addSandbox(t, m, StateRunning)
	}
	var wg sync.WaitGroup
	work := make(chan int)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if err := m.Kill(context.Background(), entries[i].sb.ID); err != nil {
					t.Errorf("kill %d: %v", i, err)
				}
				m.List(Filter{})
				m.Get(entries[(i+1)%n].sb.ID)
				if err := m.reg.admit(m.d.Limits.MaxSandboxes); err == nil {
					m.reg.inflight.Done()
				}
			}
		}()
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	m.Shutdown()
	for i, e := range entries {
		if got := rt.calls(e.sb.ID); got < 1 || got > 2 {
			t.Errorf("sandbox %d destroyed %d times, want once (twice after a transient failure)", i, got)
		}
		if got := rels[i].Load(); got != 1 {
			t.Errorf("sandbox %d released %d times, want once", i, got)
		}
	}
	if d := dyingCount(m); d != 0 {
		t.Errorf("%d teardowns pending after Shutdown", d)
	}
}

// TestSettleWaitsForMatchingTeardowns: a template or snapshot delete right
// after a kill waits for that sandbox's teardown (it still holds them), and
// only for teardowns that match.
func TestSettleWaitsForMatchingTeardowns(t *testing.T) {
	rt := newFakeRuntime()
	unblock := make(chan struct{})
	rt.destroy = func(string, int) error { <-unblock; return nil }
	m := testManager(t, rt, 10)
	e, released := addSandbox(t, m, StateRunning)
	e.sb.Template = "base"
	if err := m.Kill(context.Background(), e.sb.ID); err != nil {
		t.Fatal(err)
	}
	m.reap.settle(func(sb Sandbox) bool { return sb.Template == "other" }) // returns at once
	settled := make(chan struct{})
	go func() {
		m.reap.settle(func(sb Sandbox) bool { return sb.Template == "base" })
		close(settled)
	}()
	select {
	case <-settled:
		t.Fatal("settle returned while the sandbox of the template was still being torn down")
	case <-time.After(20 * time.Millisecond):
	}
	close(unblock)
	<-settled
	if n := released.Load(); n != 1 {
		t.Errorf("after settle: template released %d times, want once", n)
	}
}
