package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/internal/errdefs"
)

func TestBusyClassesCreateFailures(t *testing.T) {
	sync := errors.New("cannot read client sync file: waiting for sandbox to start: EOF")
	tests := []struct {
		name  string
		err   error
		class error
	}{
		{"sandbox died while booting", sync, errdefs.ErrUnavailable},
		{"worker gone", fmt.Errorf("gvisor worker: %w", errdefs.ErrUnavailable), errdefs.ErrUnavailable},
		{"no slot left", fmt.Errorf("all 4 network slots are in use: %w", errdefs.ErrResourceExhausted), errdefs.ErrResourceExhausted},
		{"bad spec stays invalid", errdefs.Invalid("runtime spec needs an ID"), errdefs.ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := busy("start the sandbox", tt.err)
			if !errors.Is(err, tt.class) {
				t.Errorf("got %v, want class %v", err, tt.class)
			}
			if !errors.Is(err, tt.err) {
				t.Errorf("got %v, want it to wrap %v", err, tt.err)
			}
			if tt.class != errdefs.ErrUnavailable && errors.Is(err, errdefs.ErrUnavailable) {
				t.Errorf("got %v: a classed error must keep its class only", err)
			}
			if !strings.Contains(err.Error(), "start the sandbox") {
				t.Errorf("got %q, want it to say which step failed", err)
			}
		})
	}
}

func TestUndoStopsAtFailureAndResumes(t *testing.T) {
	rt := newFakeRuntime()
	rt.destroy = func(_ string, call int) error {
		if call <= 2 {
			return fmt.Errorf("device busy (call %d)", call)
		}
		return nil
	}
	m := testManager(t, rt, 10)
	id := newID()
	if err := os.MkdirAll(m.rec.dir(id), 0o700); err != nil {
		t.Fatal(err)
	}
	released := 0
	u := undo{id: id}
	u.push(undoStep{kind: undoRelease, name: "template", fn: func() { released++ }})
	u.push(undoStep{kind: undoDir})
	u.push(undoStep{kind: undoContainer})
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // an undo is not cut short by its caller's cancellation
	for i := range 2 {
		if err := m.reap.runUndo(ctx, &u, 0); err == nil {
			t.Fatalf("run %d: got nil, want the destroy error", i+1)
		}
		if _, err := os.Stat(m.rec.dir(id)); err != nil || released != 0 {
			t.Fatalf("run %d: dir %v, released %d; want both kept while the container stays", i+1, err, released)
		}
	}
	if err := m.reap.runUndo(ctx, &u, 0); err != nil {
		t.Fatalf("third run: %v", err)
	}
	if err := m.reap.runUndo(ctx, &u, 0); err != nil || len(u.steps) != 0 {
		t.Fatalf("run with nothing left: %v, %d steps", err, len(u.steps))
	}
	if _, err := os.Stat(m.rec.dir(id)); !os.IsNotExist(err) || released != 1 || rt.calls(id) != 3 {
		t.Errorf("got dir %v, released %d, destroyed %d; want removed, 1, 3", err, released, rt.calls(id))
	}
}
