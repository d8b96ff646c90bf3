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
	m.size.fill(&req)
	if err := m.d.Limits.check(&req); err != nil {
		return Sandbox{}, false // the normal path reports it
	}
	if req.Network == nil {
		req.Network = &Network{AllowInternet: true}
	}
	// Pooled sandboxes were booted with the template's size.
	cpus, memMB := m.size.of(req.Template)
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

// handOut makes pooled sandbox e req's: it runs the hot boot's steps on
// e's undo stack, above what the pool's boot left there. The handout
// acquires nothing the stack must give back (a policy goes with the slot),
// so a failed step leaves the stack as it was and the caller kills the
// box. e's lock is held from the claim to the end of the boot: a kill
// waits for the handout and then finds the sandbox running.
func (m *Manager) handOut(ctx context.Context, e *entry, req CreateRequest) (Sandbox, error) {
	b := m.newBoot(BootHot, req, nil)
	b.e = e
	return b.newSandbox(ctx, hotSteps)
}

// hotSteps are the hot boot's: the sandbox was booted for the pool.
var hotSteps = []step{{"claim", (*boot).claimPooled, false}, egStep,
	{"rekey", (*boot).rekeyPooled, true}, {"running", (*boot).handedOut, false}}

// claimPooled takes the pooled sandbox b.e for the request (holding its
// lock until the boot ends) and makes its record the request's.
func (b *boot) claimPooled(ctx context.Context) error {
	e, req := b.e, b.req
	e.mu.Lock()
	b.after = append(b.after, e.mu.Unlock)
	if e.sb.State != StatePooled {
		return errNotPooled
	}
	b.u, b.floor, b.container = &e.undo, len(e.undo.steps), true
	eg, err := req.Network.egress()
	if err != nil {
		return err
	}
	b.egress = eg
	next := e.sb
	b.pooledToken = e.sb.AccessToken
	next.AccessToken = newToken()
	next.Metadata, next.EnvVars, next.Network, next.Owner = req.Metadata, req.EnvVars, *req.Network, req.Owner
	next.TrafficToken = ""
	if req.Network.PrivateTraffic {
		next.TrafficToken = newToken()
	}
	now := time.Now().UTC()
	next.StartedAt, next.EndAt = now, now.Add(req.Timeout)
	next.Timeout, next.Lifecycle = req.Timeout, req.Lifecycle
	b.sb = next
	return nil
}

// rekeyPooled gives the pooled sandbox's envd the new token and the
// request's environment.
func (b *boot) rekeyPooled(ctx context.Context) error {
	return rekey(ctx, b.m.envd, b.sb, b.pooledToken, readyEnv(b.sb))
}

// handedOut makes the claimed sandbox running with its timer (its lock is
// held since the claim).
func (b *boot) handedOut(ctx context.Context) error {
	e := b.e
	e.sb = b.sb
	e.sb.Boot = b.rec.clone()
	if err := b.m.rec.move(e, StateRunning); err != nil {
		return err
	}
	b.m.armTimer(e)
	return nil
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
