package gvisorgo

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/runtime"
)

// TestCreatesOfOneIDRace: two creates of one ID at once (a retried create
// whose first attempt got through) end with one sandbox, running, and the
// loser told it lost (a conflict), without removing the winner's parts.
func TestCreatesOfOneIDRace(t *testing.T) {
	e := newEnv(t)
	g := e.newRuntime(t, "root")
	ctx := context.Background()
	s := e.spec(t, g)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = g.Create(ctx, s) }()
	}
	wg.Wait()
	ok, conflict := 0, 0
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, errdefs.ErrConflict):
			conflict++
		default:
			t.Errorf("create: %v, want success or a conflict", err)
		}
	}
	if ok != 1 || conflict != 1 {
		t.Fatalf("%d creates succeeded and %d conflicted; want one of each (%v)", ok, conflict, errs)
	}
	if st, err := g.State(ctx, s.ID); err != nil || st != runtime.StatusRunning {
		t.Fatalf("the winner's state: %s %v; want running", st, err)
	}
	if got := mustExec(t, g, s.ID, "echo alive"); got != "alive\n" {
		t.Errorf("exec in the winner: %q", got)
	}
}
