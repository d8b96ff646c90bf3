// Package spare owns the spares: the capacity the sandbox manager makes
// ahead of demand, of two kinds kept in two pools (Hot: booted sandboxes;
// Warm: containers prepared for a restore). Per template it holds what
// waits to be taken, what is being made, the refill loops, and (Warm) the
// demand for warm containers. A spare is an opaque T: the package knows
// neither the boot pipeline, nor the registry, nor what a spare holds; it
// reaches the manager only through Host's functions.
//
// Lock order: the manager's lock, then a pool's, then the manager's
// registry's. A pool's lock is held only around its own maps, never while
// calling into Host, so the manager may read or change a pool while
// holding its own lock (a pooled sandbox leaves the hot pool as it is
// counted as dying; the manager counts the spares and its teardowns at one
// instant).
package spare

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/agentenv/agentenv/internal/refcount"
)

// Host is what a pool needs of the manager.
type Host[T any] struct {
	// Size is how many spares the pool keeps per template (a warm
	// pool's demand may ask for more); Off stops it from making any.
	Size int
	Off  bool
	Log  *slog.Logger
	// Templates lists the stored templates' names.
	Templates func() []string
	// Preparing says whether a template is being built, made ready or
	// deleted: no spare of it is made meanwhile.
	Preparing func(template string) bool
	// Make makes one spare of the template and lists it (Add); Drop
	// gives one back.
	Make func(ctx context.Context, template string) error
	Drop func(ctx context.Context, x T)
}

// Set is one pool's spares per template, under its own lock.
type Set[T any] struct {
	mu sync.Mutex
	// lists holds the spares ready to be taken, per template; making
	// counts those being made (listed at the end of their making).
	lists  map[string][]T
	making *refcount.Counts[string]
	// build is held while a spare is made: one at a time per pool, and
	// Settle waits for the one being made.
	build sync.Mutex
	// kick wakes the refill loop.
	kick chan struct{}
	host Host[T]
}

// Init readies the pool; call it once, before any other method.
func (s *Set[T]) Init(h Host[T]) {
	s.lists, s.making = map[string][]T{}, refcount.New[string](&s.mu, nil)
	s.kick = make(chan struct{}, 1)
	s.host = h
}

// Wake wakes the refill loop without blocking (one pending wake-up is
// enough).
func (s *Set[T]) Wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Add lists a spare of the template.
func (s *Set[T]) Add(template string, x T) {
	s.mu.Lock()
	s.lists[template] = append(s.lists[template], x)
	s.mu.Unlock()
}

// Listed is how many spares of the template wait to be taken.
func (s *Set[T]) Listed(template string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.lists[template])
}

// Held is how many spares of the template there are, listed or being
// made: each holds the template.
func (s *Set[T]) Held(template string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.lists[template]) + s.making.N(template)
}

// Counts is how many spares wait, per template.
func (s *Set[T]) Counts() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.lists))
	for t, l := range s.lists {
		out[t] = len(l)
	}
	return out
}

// templates lists the templates that have spares.
func (s *Set[T]) templates() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.lists))
	for t := range s.lists {
		out = append(out, t)
	}
	return out
}

// Of returns a copy of the template's spares, leaving them listed.
func (s *Set[T]) Of(template string) []T {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.lists[template])
}

// drain empties the pool and returns what it held.
func (s *Set[T]) drain() []T {
	s.mu.Lock()
	all := s.lists
	s.lists = map[string][]T{}
	s.mu.Unlock()
	var out []T
	for _, l := range all {
		out = append(out, l...)
	}
	return out
}

// MakeOne runs make, which makes one spare of template and lists it,
// under the pool's build lock, unless the template is being built, made
// ready or deleted (Host.Preparing); ran says whether make ran.
func (s *Set[T]) MakeOne(template string, make func() error) (ran bool, err error) {
	s.build.Lock()
	defer s.build.Unlock()
	if s.host.Preparing(template) {
		return false, nil
	}
	s.mu.Lock()
	done := s.making.Hold(template)
	s.mu.Unlock()
	defer done()
	return true, make()
}

// Settle returns once the spare being made, if any, is listed.
func (s *Set[T]) Settle() {
	s.build.Lock()
	s.build.Unlock()
}

// loop runs refill at once, on a Wake and every second until ctx ends,
// then drops every spare left. A pool that is off only waits.
func (s *Set[T]) loop(ctx context.Context, refill func(context.Context)) {
	defer s.dropAll()
	if s.host.Off || s.host.Size <= 0 {
		<-ctx.Done()
		return
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		refill(ctx)
		select {
		case <-ctx.Done():
			return
		case <-s.kick:
		case <-tick.C:
		}
	}
}

// dropAll empties the pool and drops what it held.
func (s *Set[T]) dropAll() {
	for _, x := range s.drain() {
		s.host.Drop(context.Background(), x)
	}
}
