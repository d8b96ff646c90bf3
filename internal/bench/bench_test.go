package bench

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

// fakeTarget records calls and fails at one step.
type fakeTarget struct {
	failAt Operation
	calls  []string
}

func (f *fakeTarget) name() string { return "fake" }

func (f *fakeTarget) step(op Operation) error {
	f.calls = append(f.calls, string(op))
	if op == f.failAt {
		return errors.New("boom")
	}
	return nil
}

func (f *fakeTarget) create(context.Context) (string, error) { return "id", f.step(OpCreate) }
func (f *fakeTarget) exec(context.Context, string) error     { return f.step(OpExec) }
func (f *fakeTarget) writeRead(context.Context, string, []byte) error {
	return f.step(OpFile)
}
func (f *fakeTarget) kill(context.Context, string) error { return f.step(OpKill) }

func TestCycle(t *testing.T) {
	tests := []struct {
		failAt    Operation
		wantCalls []string
		wantErr   bool
	}{
		{"", []string{"create", "exec", "write_read_1mib", "kill"}, false},
		{OpCreate, []string{"create"}, true},
		// A failure after create still kills the container.
		{OpExec, []string{"create", "exec", "kill"}, true},
		{OpFile, []string{"create", "exec", "write_read_1mib", "kill"}, true},
		// A failed kill is not retried here; the target's close sweeps up.
		{OpKill, []string{"create", "exec", "write_read_1mib", "kill"}, true},
	}
	for _, tt := range tests {
		t.Run("fail at "+string(tt.failAt), func(t *testing.T) {
			f := &fakeTarget{failAt: tt.failAt}
			d, err := cycle(context.Background(), f, nil)
			if (err != nil) != tt.wantErr {
				t.Fatalf("cycle error = %v, want error %v", err, tt.wantErr)
			}
			if !slices.Equal(f.calls, tt.wantCalls) {
				t.Errorf("calls = %v, want %v", f.calls, tt.wantCalls)
			}
			if want := 4; err == nil && len(d) != want {
				t.Errorf("got %d timings, want %d", len(d), want)
			}
		})
	}
}

func TestCleanupStack(t *testing.T) {
	var order []int
	var cl cleanupStack
	errA, errC := errors.New("a"), errors.New("c")
	cl.push(func(context.Context) error { order = append(order, 1); return errA })
	cl.push(func(context.Context) error { order = append(order, 2); return nil })
	cl.push(func(context.Context) error { order = append(order, 3); return errC })
	err := cl.run(context.Background())
	if want := []int{3, 2, 1}; !slices.Equal(order, want) {
		t.Errorf("teardown order = %v, want %v", order, want)
	}
	if !errors.Is(err, errA) || !errors.Is(err, errC) {
		t.Errorf("run error = %v, want both a and c joined", err)
	}
	if err := cl.run(context.Background()); err != nil || len(order) != 3 {
		t.Errorf("second run: err %v, %d teardowns; want each teardown once", err, len(order))
	}
}

func TestCheckPayload(t *testing.T) {
	if err := checkPayload([]byte("abc"), []byte("abc")); err != nil {
		t.Errorf("same bytes: got %v, want nil", err)
	}
	if err := checkPayload([]byte("abd"), []byte("abc")); err == nil {
		t.Error("different bytes: got nil, want an error")
	}
}

func TestForEach(t *testing.T) {
	var (
		mu        sync.Mutex
		cur, peak int
		seen      []string
		errB      = errors.New("b failed")
		ids       = []string{"a", "b", "c", "d", "e"}
	)
	err := forEach(context.Background(), ids, 2, func(_ context.Context, id string) error {
		mu.Lock()
		cur++
		peak = max(peak, cur)
		seen = append(seen, id)
		mu.Unlock()
		time.Sleep(2 * time.Millisecond)
		mu.Lock()
		cur--
		mu.Unlock()
		if id == "b" {
			return errB
		}
		return nil
	})
	if !errors.Is(err, errB) {
		t.Errorf("forEach error = %v, want %v", err, errB)
	}
	slices.Sort(seen)
	if !slices.Equal(seen, ids) {
		t.Errorf("called for %v, want %v", seen, ids)
	}
	if peak > 2 {
		t.Errorf("%d calls at once, want at most 2", peak)
	}
}
