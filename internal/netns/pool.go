package netns

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/vishvananda/netlink"

	"github.com/agentenv/agentenv/internal/errdefs"
)

// Pool hands out slots and takes them back. It keeps up to Size slots made
// ahead of time, so creating a sandbox does not wait for a namespace and
// veths, and it recycles released slots (re-addressing them) instead of
// deleting them, because deleting a veth costs 15-25 ms.
type Pool struct {
	m    *Manager
	size int
	log  *slog.Logger

	mu      sync.Mutex
	used    map[int]bool // indexes given out (or being made)
	ready   []Slot       // made, unused
	refill  chan struct{}
	closed  bool
	stopped chan struct{}
}

// NewPool returns a pool of up to size ready slots. Call Run to keep it
// filled and Close to stop.
func NewPool(m *Manager, size int, log *slog.Logger) *Pool {
	if log == nil {
		log = slog.Default()
	}
	return &Pool{m: m, size: size, log: log, used: map[int]bool{}, refill: make(chan struct{}, 1), stopped: make(chan struct{})}
}

// MarkUsed records a slot that a sandbox already holds (after a restart).
func (p *Pool) MarkUsed(index int) {
	p.mu.Lock()
	p.used[index] = true
	p.mu.Unlock()
}

// Used reports whether index is given out or ready in the pool.
func (p *Pool) Used(index int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.used[index]
}

func (p *Pool) reserve() (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := 0; i < p.m.Capacity(); i++ {
		if !p.used[i] {
			p.used[i] = true
			return i, nil
		}
	}
	return 0, fmt.Errorf("all %d network slots are in use: kill sandboxes or widen --network-cidr: %w", p.m.Capacity(), errdefs.ErrResourceExhausted)
}

func (p *Pool) unreserve(i int) {
	p.mu.Lock()
	delete(p.used, i)
	p.mu.Unlock()
}

// Get returns a slot ready for a sandbox to start in: one made ahead if
// there is one, else a new one.
func (p *Pool) Get(ctx context.Context) (Slot, error) {
	p.mu.Lock()
	if n := len(p.ready); n > 0 {
		s := p.ready[n-1]
		p.ready = p.ready[:n-1]
		p.mu.Unlock()
		p.kick()
		return s, nil
	}
	p.mu.Unlock()
	p.kick()
	i, err := p.reserve()
	if err != nil {
		return Slot{}, err
	}
	s, err := p.m.Create(ctx, i)
	if err != nil {
		p.unreserve(i)
		return Slot{}, err
	}
	return s, nil
}

// Put takes a slot back once its sandbox is gone: its egress policy is
// removed and it is recycled into the pool, or deleted when the pool is
// full or recycling fails.
func (p *Pool) Put(ctx context.Context, s Slot) error {
	errEgress := p.m.ClearEgress(ctx, s)
	p.mu.Lock()
	keep := !p.closed && len(p.ready) < p.size
	p.mu.Unlock()
	if keep && errEgress == nil {
		if err := p.m.Recycle(ctx, s); err == nil {
			p.mu.Lock()
			keep = !p.closed && len(p.ready) < p.size
			if keep {
				p.ready = append(p.ready, s)
			}
			p.mu.Unlock()
			if keep {
				return nil
			}
		} else {
			p.log.Warn("recycle network slot failed; deleting it", "slot", s.Index, "err", err)
		}
	}
	err := p.m.Delete(ctx, s)
	if err == nil {
		p.unreserve(s.Index)
	}
	return errors.Join(errEgress, err)
}

func (p *Pool) kick() {
	select {
	case p.refill <- struct{}{}:
	default:
	}
}

// Run keeps the pool filled until ctx ends, then deletes the ready slots.
func (p *Pool) Run(ctx context.Context) {
	defer close(p.stopped)
	p.kick()
	for {
		select {
		case <-ctx.Done():
			p.drain()
			return
		case <-p.refill:
		}
		for {
			p.mu.Lock()
			need := !p.closed && len(p.ready) < p.size
			p.mu.Unlock()
			if !need || ctx.Err() != nil {
				break
			}
			i, err := p.reserve()
			if err != nil {
				break
			}
			s, err := p.m.Create(ctx, i)
			if err != nil {
				p.unreserve(i)
				p.log.Warn("pre-create network slot failed", "slot", i, "err", err)
				break
			}
			p.mu.Lock()
			if len(p.ready) < p.size && !p.closed {
				p.ready = append(p.ready, s)
				s = Slot{}
			}
			p.mu.Unlock()
			if s.Namespace != "" {
				// Filled meanwhile by a recycled slot.
				p.m.Delete(ctx, s)
				p.unreserve(s.Index)
			}
		}
	}
}

// Close stops refilling and deletes the ready slots (Run does it when its
// context ends; Close waits for that).
func (p *Pool) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	<-p.stopped
}

func (p *Pool) drain() {
	p.mu.Lock()
	p.closed = true
	ready := p.ready
	p.ready = nil
	p.mu.Unlock()
	for _, s := range ready {
		if err := p.m.Delete(context.Background(), s); err != nil {
			p.log.Warn("delete pooled network slot", "slot", s.Index, "err", err)
		}
		p.unreserve(s.Index)
	}
}

// Recycle makes a slot whose sandbox is gone ready for the next one: the
// namespace side loses its addresses, eth0 gets the internal
// address back (the runtime removed it), connection tracking is flushed.
func (m *Manager) Recycle(_ context.Context, s Slot) error {
	if m.loopback {
		return nil
	}
	h, err := handleIn(s)
	if err != nil {
		return err
	}
	defer h.Close()
	for _, name := range []string{gatewayIf, uplinkIf} {
		l, err := h.LinkByName(name)
		if err != nil {
			return err
		}
		// Links stay up (see the package comment); addresses and
		// neighbours go.
		flushNeighbours(h, name)
		addrs, err := h.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			if err := h.AddrDel(l, &a); err != nil {
				return err
			}
		}
	}
	if err := h.ConntrackTableFlush(netlink.ConntrackTable); err != nil {
		return fmt.Errorf("flush connection tracking: %w", err)
	}
	flushNeighbours(nil, s.HostIf)
	return addressSandboxSide(h)
}
