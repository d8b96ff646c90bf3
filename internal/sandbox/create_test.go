package sandbox

import (
	"context"
	"errors"
	"fmt"
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

func TestCleanupRetryRunsOnlyFailedSteps(t *testing.T) {
	var c cleanup
	runs := map[string]int{}
	fails := map[string]int{"destroy": 2}
	for _, name := range []string{"slot", "destroy", "dir"} {
		c.add(func(context.Context) error {
			runs[name]++
			if fails[name] > 0 {
				fails[name]--
				return fmt.Errorf("%s failed", name)
			}
			return nil
		})
	}
	if err := c.run(context.Background()); err == nil {
		t.Fatal("run: got nil, want the destroy error")
	}
	if err := c.retry(context.Background()); err == nil {
		t.Fatal("first retry: got nil, want the destroy error again")
	}
	if err := c.retry(context.Background()); err != nil {
		t.Fatalf("second retry: %v", err)
	}
	if err := c.retry(context.Background()); err != nil {
		t.Fatalf("retry with nothing left: %v", err)
	}
	if want := map[string]int{"slot": 1, "destroy": 3, "dir": 1}; fmt.Sprint(runs) != fmt.Sprint(want) {
		t.Errorf("got runs %v, want %v", runs, want)
	}
}
