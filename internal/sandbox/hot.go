package sandbox

import (
	"context"
	"time"
)

// The hot pool: per template, HotPool sandboxes are booted ahead of demand
// and wait, idle, in state pooled (not listed, no timer). A create that
// asks for the template's size takes one: envd gets the new sandbox's token
// and environment through /init, the record gets its metadata, policy and
// timeout, and it is running — no boot on the request's path.

// takeHot hands out a pooled sandbox for req, if one fits.
func (m *Manager) takeHot(ctx context.Context, req CreateRequest) (Sandbox, bool) {
	if m.d.Limits.HotPool <= 0 {
		return Sandbox{}, false
	}
	m.sized(&req)
	if err := m.d.Limits.check(&req); err != nil {
		return Sandbox{}, false // the normal path reports it
	}
	if req.Network == nil {
		req.Network = &Network{AllowInternet: true}
	}
	// Pooled sandboxes were booted with the template's size.
	cpus, memMB := m.templateSize(req.Template)
	if _, err := req.Network.egress(); err != nil || req.CPUs != cpus || req.MemoryMB != memMB {
		return Sandbox{}, false
	}
	for {
		id, ok := m.hot.Pop(req.Template)
		m.hot.Wake()
		if !ok {
			return Sandbox{}, false
		}
		e := m.reg.get(id)
		if e == nil {
			continue
		}
		sb, err := m.handOut(ctx, e, req)
		if err != nil {
			m.d.Log.Warn("pooled sandbox could not be handed out; killing it", "sandbox", id, "err", err)
			m.Kill(context.WithoutCancel(ctx), id)
			continue
		}
		return sb, true
	}
}

func (m *Manager) handOut(ctx context.Context, e *entry, req CreateRequest) (Sandbox, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.sb.State != StatePooled {
		return Sandbox{}, errNotPooled
	}
	next := e.sb
	next.AccessToken = newToken()
	next.Metadata, next.EnvVars, next.Network, next.Owner = req.Metadata, req.EnvVars, *req.Network, req.Owner
	next.TrafficToken = ""
	if req.Network.PrivateTraffic {
		next.TrafficToken = newToken()
	}
	now := time.Now().UTC()
	next.StartedAt, next.EndAt = now, now.Add(req.Timeout)
	next.Timeout, next.Lifecycle = req.Timeout, req.Lifecycle
	if eg, err := req.Network.egress(); err == nil && !defaultNetwork(*req.Network) {
		if err := m.d.Net.SetEgress(ctx, next.Slot, eg); err != nil {
			return Sandbox{}, err
		}
	}
	if err := m.rekey(ctx, next, e.sb.AccessToken, readyEnv(next)); err != nil {
		return Sandbox{}, err
	}
	// Its boot happened before: the create's record is the hand-out.
	took := time.Since(now)
	next.Boot = &BootRecord{Kind: BootHot, Steps: []StepTime{{Step: "handout", Wall: took}}}
	if fn := m.stepObs.Load(); fn != nil && *fn != nil {
		(*fn)(BootHot, "handout", took, -1)
	}
	e.sb = next
	if err := m.move(e, StateRunning); err != nil {
		return Sandbox{}, err
	}
	m.armTimer(e)
	m.d.Log.Info("sandbox running", "sandbox", next.ID, "template", next.Template, "hot", true, "took", time.Since(now).Round(time.Microsecond))
	return e.sb, nil
}

func defaultNetwork(n Network) bool {
	return n.AllowInternet && len(n.AllowOut) == 0 && len(n.DenyOut) == 0
}

type hotError string

func (e hotError) Error() string { return string(e) }

const errNotPooled = hotError("sandbox is no longer pooled")

// RunHot keeps HotPool booted sandboxes per template until ctx ends, then
// kills them.
func (m *Manager) RunHot(ctx context.Context) { m.hot.Run(ctx) }
