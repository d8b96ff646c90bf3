package spare

import (
	"context"
	"slices"
	"time"
)

const (
	// Linger is how long a template stays warm after its last restore.
	Linger = 10 * time.Minute
	// Quiet is how long refills wait after a warm container was taken:
	// long enough for the restores of a fork to reach the runtime, whose
	// workers then serve them before any refill (see gvisorgo's dispatch).
	Quiet = 100 * time.Millisecond
)

// Warm is the warm pool: containers prepared for restores, per template,
// and the demand for them.
type Warm[T any] struct {
	Set[T]
	// demand holds, per template restored from lately, how many warm
	// containers it wants and until when.
	demand   map[string]demand
	lastTake time.Time
	// Ready says whether the template has a ready snapshot: those keep
	// Host.Size warm containers. Set it before Run.
	Ready func(template string) bool
}

type demand struct {
	n     int
	until time.Time
}

// Pop takes a warm container of the template that match accepts, if
// there is one.
func (p *Warm[T]) Pop(template string, match func(T) bool) (T, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	list := p.lists[template]
	for i, w := range list {
		if match(w) {
			p.lastTake = time.Now()
			p.lists[template] = append(list[:i:i], list[i+1:]...)
			return w, true
		}
	}
	var zero T
	return zero, false
}

// Want keeps the template's warm containers at n or more (Host.Size at
// least) for Linger.
func (p *Warm[T]) Want(template string, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.demand == nil {
		p.demand = map[string]demand{}
	}
	d := p.demand[template]
	if time.Now().After(d.until) {
		d.n = 0
	}
	d.n = max(d.n, n, p.host.Size)
	d.until = time.Now().Add(Linger)
	p.demand[template] = d
}

// target is how many warm containers the template should have now.
// Callers hold p.mu.
func (p *Warm[T]) target(template string, ready bool) int {
	n := 0
	if ready {
		n = p.host.Size
	}
	if d, ok := p.demand[template]; ok {
		if time.Now().Before(d.until) {
			n = max(n, d.n)
		} else {
			delete(p.demand, template)
		}
	}
	return n
}

// trim cuts the template's warm containers to its target and returns
// those cut (to be dropped), whether it is short of the target, and how
// long refills should still wait after the last take.
func (p *Warm[T]) trim(template string, ready bool) (extra []T, short bool, quiet time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	have, want := len(p.lists[template]), p.target(template, ready)
	if have > want {
		extra = p.lists[template][want:]
		p.lists[template] = p.lists[template][:want:want]
	}
	return extra, have < want, Quiet - time.Since(p.lastTake)
}

// DropOf removes the warm containers of a template (it was deleted or
// rebuilt) and forgets its demand.
func (p *Warm[T]) DropOf(template string) {
	p.mu.Lock()
	list := p.lists[template]
	delete(p.lists, template)
	delete(p.demand, template)
	p.mu.Unlock()
	for _, w := range list {
		p.host.Drop(context.Background(), w)
	}
}

// Run keeps the warm containers of each template at their target until
// ctx ends, then drops them.
func (p *Warm[T]) Run(ctx context.Context) { p.loop(ctx, p.refill) }

// refill brings each template's warm containers to its target, one at a
// time, and drops those of templates no longer wanted or gone. Refills
// wait until none has been taken for Quiet, so that they do not compete
// with the burst of restores (a fork) they are meant to speed up.
func (p *Warm[T]) refill(ctx context.Context) {
	h := p.host
	templates := h.Templates()
	for _, name := range p.templates() {
		if !slices.Contains(templates, name) {
			p.DropOf(name)
		}
	}
	for _, t := range templates {
		ready := p.Ready(t)
		for ctx.Err() == nil {
			extra, short, quiet := p.trim(t, ready)
			for _, w := range extra {
				h.Drop(context.WithoutCancel(ctx), w)
			}
			if !short {
				break
			}
			if quiet > 0 {
				// A burst of restores is taking warm containers: let it
				// finish first.
				select {
				case <-ctx.Done():
				case <-time.After(quiet):
				}
				continue
			}
			ran, err := p.MakeOne(t, func() error { return h.Make(ctx, t) })
			if err != nil {
				h.Log.Warn("prepare a warm container", "template", t, "err", err)
			}
			if !ran || err != nil {
				break
			}
		}
	}
}
