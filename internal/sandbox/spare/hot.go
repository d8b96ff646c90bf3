package spare

import (
	"context"
	"slices"
)

// Hot is the hot pool: the IDs of booted idle sandboxes, per template.
// The sandboxes themselves are the manager's (in its registry).
type Hot struct {
	Set[string]
}

// Pop takes the last pooled sandbox of the template, if any.
func (p *Hot) Pop(template string) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ids := p.lists[template]
	if len(ids) == 0 {
		return "", false
	}
	p.lists[template] = ids[:len(ids)-1]
	return ids[len(ids)-1], true
}

// Remove forgets a pooled sandbox (it is being killed).
func (p *Hot) Remove(template, id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lists[template] = slices.DeleteFunc(p.lists[template], func(h string) bool { return h == id })
}

// Run keeps Host.Size sandboxes per template until ctx ends, then drops
// them.
func (p *Hot) Run(ctx context.Context) { p.loop(ctx, p.refill) }

// refill boots sandboxes until each template has its number, one at a
// time; templates being prepared are left alone.
func (p *Hot) refill(ctx context.Context) {
	h := p.host
	for _, t := range h.Templates() {
		if h.Preparing(t) {
			continue
		}
		for ctx.Err() == nil {
			if p.Listed(t) >= h.Size {
				break
			}
			ran, err := p.MakeOne(t, func() error { return h.Make(ctx, t) })
			if err != nil {
				h.Log.Warn("boot a sandbox for the hot pool", "template", t, "err", err)
			}
			if !ran || err != nil {
				break
			}
		}
	}
}
