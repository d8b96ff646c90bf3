package sandbox

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"
)

// Spares are what the server makes ahead of demand: warm containers
// (warm.go) and pooled sandboxes (hot.go). Users neither see nor kill
// them, so although they hold their template as sandboxes do, they never
// keep it from being deleted (they go with it), and a template's "in use"
// leaves them out.

// Unlisted is how many holders of the template are not sandboxes a user
// sees: its spares (and those being made), and sandboxes killed but still
// being torn down.
func (m *Manager) Unlisted(template string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := m.warm.held(template) + m.hot.held(template)
	for _, t := range m.dying {
		if t != nil && t.sb.Template == template {
			n++
		}
	}
	return n
}

// dropSpares removes the template's spares and keeps new ones from being
// made until done is called, and waits until what they held is released.
func (m *Manager) dropSpares(template string) (done func()) {
	done = m.Preparing(template)
	// A spare being made finishes (and is listed) first; the next ones
	// see the mark and are not made.
	m.warm.settle()
	m.hot.settle()
	m.warm.dropOf(template)
	for _, id := range m.hot.of(template) {
		// Only if still pooled: a create may have just taken it.
		if e, err := m.entry(id); err == nil {
			m.killWhen(context.Background(), e, "", func(sb Sandbox) bool { return sb.State == StatePooled })
		}
	}
	m.settle(func(sb Sandbox) bool { return sb.Template == template })
	return done
}

// spares is one pool's spares per template, with its own lock. Lock
// order: Manager.mu, then a pool's mu — a pool's lock is a leaf, held
// only around its own maps and never while calling into the manager, so
// the manager may read or change a pool while it holds m.mu (kill.go
// drops a pooled sandbox from the hot pool as it leaves the registry;
// Unlisted counts the pools and teardowns at one instant).
type spares[T any] struct {
	mu sync.Mutex
	// lists holds the spares ready to be taken, per template; making
	// counts those being made (listed at the end of their making).
	lists  map[string][]T
	making map[string]int
	// build is held while a spare is made: one at a time per pool, and
	// dropSpares waits for the one being made.
	build sync.Mutex
	// kick wakes the pool's refill loop.
	kick chan struct{}
	host spareHost[T]
}

// spareHost is what a pool needs of the manager, as functions New sets:
// the pools know neither the boot pipeline nor the registry.
type spareHost[T any] struct {
	// size is how many spares a pool keeps per template (WarmPool,
	// HotPool; a warm pool's demand may ask for more); off stops the
	// pool from making any.
	size int
	off  bool
	log  *slog.Logger
	// templates lists the stored templates' names.
	templates func() []string
	// preparing says whether a template is being built, made ready or
	// deleted: no spare of it is made meanwhile (Manager.isPreparing).
	preparing func(template string) bool
	// make makes one spare of the template through the boot pipeline
	// and lists it (add); drop gives one back through its undo stack.
	make func(ctx context.Context, template string) error
	drop func(ctx context.Context, x T)
}

func (s *spares[T]) init(h spareHost[T]) {
	s.lists, s.making = map[string][]T{}, map[string]int{}
	s.kick = make(chan struct{}, 1)
	s.host = h
}

// loop runs refill at once, on a kick and every second until ctx ends,
// then drops every spare left. A pool that is off only waits.
func (s *spares[T]) loop(ctx context.Context, refill func(context.Context)) {
	defer s.dropAll()
	if s.host.off || s.host.size <= 0 {
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
func (s *spares[T]) dropAll() {
	for _, x := range s.drain() {
		s.host.drop(context.Background(), x)
	}
}

// wake wakes the refill loop without blocking.
func (s *spares[T]) wake() { kick(s.kick) }

func (s *spares[T]) add(template string, x T) {
	s.mu.Lock()
	s.lists[template] = append(s.lists[template], x)
	s.mu.Unlock()
}

// listed is how many spares of the template wait to be taken.
func (s *spares[T]) listed(template string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.lists[template])
}

// held is how many spares of the template there are, listed or being
// made: each holds the template.
func (s *spares[T]) held(template string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.lists[template]) + s.making[template]
}

// counts is how many spares wait per template.
func (s *spares[T]) counts() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.lists))
	for t, l := range s.lists {
		out[t] = len(l)
	}
	return out
}

// templates lists the templates that have spares.
func (s *spares[T]) templates() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.lists))
	for t := range s.lists {
		out = append(out, t)
	}
	return out
}

// of returns a copy of the template's spares, leaving them listed.
func (s *spares[T]) of(template string) []T {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.lists[template])
}

// drain empties the pool and returns what it held, to be dropped
// outside the lock.
func (s *spares[T]) drain() []T {
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

// makeOne runs make, which makes one spare of template and lists it,
// under build, unless the template is being built, made ready or deleted
// (preparing); ran says whether make ran.
func (s *spares[T]) makeOne(template string, make func() error) (ran bool, err error) {
	s.build.Lock()
	defer s.build.Unlock()
	if s.host.preparing(template) {
		return false, nil
	}
	s.mu.Lock()
	s.making[template]++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		if s.making[template]--; s.making[template] <= 0 {
			delete(s.making, template)
		}
		s.mu.Unlock()
	}()
	return true, make()
}

// settle returns once the spare being made, if any, is listed.
func (s *spares[T]) settle() {
	s.build.Lock()
	s.build.Unlock()
}
