package sandbox

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestRunBoot: steps run in order, each timed into the record and the
// observer; a failing step runs what the boot pushed in reverse (a new
// box's whole stack) and what it held for the boot only, once.
func TestRunBoot(t *testing.T) {
	var mu sync.Mutex
	var log []string
	note := func(s string) { mu.Lock(); log = append(log, s); mu.Unlock() }
	pusher := func(name string) step {
		return step{name, func(b *boot, _ context.Context) error {
			note("run " + name)
			b.u.push(undoStep{kind: undoRelease, name: name, fn: func() { note("undo " + name) }})
			return nil
		}, false}
	}
	boom := errors.New("boom")
	failing := step{"fail", func(b *boot, _ context.Context) error {
		b.after = append(b.after, func() { note("after") })
		return boom
	}, false}

	tests := []struct {
		name  string
		steps []step
		err   error
		want  string
	}{
		{"all pass", []step{pusher("a"), pusher("b")}, nil, "run a,run b"},
		{"undone in reverse", []step{pusher("a"), pusher("b"), failing, pusher("c")}, boom, "run a,run b,undo b,undo a,after"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			log = nil
			m := testManager(t, newFakeRuntime(), 10)
			var observed []string
			m.ObserveBootSteps(func(kind, step string, wall, cpu time.Duration) {
				if cpu >= 0 {
					t.Errorf("step %s: got cpu %v, want unknown (-1)", step, cpu)
				}
				observed = append(observed, kind+"/"+step)
			})
			b := m.newBoot(BootCreate, CreateRequest{}, nil)
			b.sb.ID = newID()
			b.u.id = b.sb.ID
			err := b.run(context.Background(), tt.steps)
			if !errors.Is(err, tt.err) {
				t.Fatalf("got %v, want %v", err, tt.err)
			}
			if got := strings.Join(log, ","); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
			ran := min(len(tt.steps), len(b.rec.Steps))
			if len(observed) != ran || len(b.rec.Steps) != ran || b.rec.Steps[ran-1].Step != tt.steps[ran-1].name {
				t.Errorf("recorded %v, observed %v; want the %d steps that ran", b.rec.Steps, observed, ran)
			}
			if tt.err != nil && (len(b.u.steps) != 0 || dyingCount(m) != 0) {
				t.Errorf("after the failure: %d undo steps left, %d dying; want none", len(b.u.steps), dyingCount(m))
			}
		})
	}
}
