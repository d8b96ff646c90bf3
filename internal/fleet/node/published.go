package node

import (
	"context"
	"time"

	"github.com/agentenv/agentenv/internal/sandbox"
	"github.com/agentenv/agentenv/internal/service"
	"github.com/agentenv/agentenv/internal/snapshot"
	"github.com/agentenv/agentenv/internal/template"
)

// published is the node's service.Backend: the host's, with each change
// written to etcd before the answer.
type published struct {
	*service.Local
	n *Node
}

func (p *published) Create(ctx context.Context, req sandbox.CreateRequest) (sandbox.Sandbox, error) {
	// A copy from a peer may take long: outside the gate, so that a
	// reconcile never waits for it.
	if err := p.n.ensure(ctx, req.Template, req.Owner); err != nil {
		return sandbox.Sandbox{}, err
	}
	p.n.gate.RLock()
	defer p.n.gate.RUnlock()
	sb, err := p.Local.Create(ctx, req)
	if err != nil {
		return sb, err
	}
	return p.recorded(ctx, sb)
}

// recorded publishes a new sandbox; one that cannot be recorded is killed
// (unrecorded, it would be killed at the next reconcile anyway).
func (p *published) recorded(ctx context.Context, sb sandbox.Sandbox) (sandbox.Sandbox, error) {
	if err := p.n.record(ctx, sb.ID); err != nil {
		p.Local.Kill(context.WithoutCancel(ctx), sb.ID)
		return sandbox.Sandbox{}, err
	}
	return sb, nil
}

func (p *published) after(ctx context.Context, id string, sb sandbox.Sandbox, err error) (sandbox.Sandbox, error) {
	if err != nil {
		return sb, err
	}
	if err := p.n.record(ctx, id); err != nil {
		return sb, err
	}
	return sb, nil
}

func (p *published) Kill(ctx context.Context, id string) error {
	if err := p.Local.Kill(ctx, id); err != nil {
		return err
	}
	return p.n.record(ctx, id)
}

func (p *published) SetTimeout(ctx context.Context, id string, d time.Duration) (sandbox.Sandbox, error) {
	sb, err := p.Local.SetTimeout(ctx, id, d)
	return p.after(ctx, id, sb, err)
}

func (p *published) Extend(ctx context.Context, id string, d time.Duration) (sandbox.Sandbox, error) {
	sb, err := p.Local.Extend(ctx, id, d)
	return p.after(ctx, id, sb, err)
}

func (p *published) SetNetwork(ctx context.Context, id string, nw sandbox.Network) (sandbox.Sandbox, error) {
	sb, err := p.Local.SetNetwork(ctx, id, nw)
	return p.after(ctx, id, sb, err)
}

func (p *published) Pause(ctx context.Context, id string) (sandbox.Sandbox, error) {
	sb, err := p.Local.Pause(ctx, id)
	return p.after(ctx, id, sb, err)
}

// PauseFiles keeps only the sandbox's files (pause with memory: false).
func (p *published) PauseFiles(ctx context.Context, id string) (sandbox.Sandbox, error) {
	sb, err := p.Local.PauseFiles(ctx, id)
	return p.after(ctx, id, sb, err)
}

func (p *published) Resume(ctx context.Context, id string, d time.Duration) (sandbox.Sandbox, error) {
	sb, err := p.Local.Resume(ctx, id, d)
	return p.after(ctx, id, sb, err)
}

// Connect resumes or extends, and records the result before answering.
func (p *published) Connect(ctx context.Context, id string, d time.Duration) (sandbox.Sandbox, bool, error) {
	sb, resumed, err := p.Local.Connect(ctx, id, d)
	sb, err = p.after(ctx, id, sb, err)
	return sb, resumed, err
}

func (p *published) Snapshot(ctx context.Context, id string, req sandbox.SnapshotRequest) (snapshot.Snapshot, error) {
	sn, err := p.Local.Snapshot(ctx, id, req)
	if err != nil {
		return sn, err
	}
	return sn, p.n.publishNow(ctx)
}

func (p *published) Fork(ctx context.Context, id string, count int, d time.Duration, metadata map[string]string) ([]sandbox.ForkResult, error) {
	p.n.gate.RLock()
	defer p.n.gate.RUnlock()
	res, err := p.Local.Fork(ctx, id, count, d, metadata)
	for i, fr := range res {
		if fr.Err == nil {
			res[i].Sandbox, res[i].Err = p.recorded(ctx, fr.Sandbox)
		}
	}
	return res, err
}

func (p *published) DeleteSnapshot(ctx context.Context, id string) error {
	if err := p.Local.DeleteSnapshot(ctx, id); err != nil {
		return err
	}
	return p.n.publishNow(ctx)
}

func (p *published) DeleteTemplate(ctx context.Context, name string) error {
	if err := p.Local.DeleteTemplate(ctx, name); err != nil {
		return err
	}
	return p.n.publishNow(ctx)
}

func (p *published) BuildTemplate(ctx context.Context, req template.BuildRequest, progress func(template.Progress)) (service.TemplateInfo, error) {
	t, err := p.Local.BuildTemplate(ctx, req, progress)
	if err != nil {
		return t, err
	}
	return t, p.n.publishNow(ctx)
}
