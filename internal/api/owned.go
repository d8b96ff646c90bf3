package api

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/sandbox"
	"github.com/agentenv/agentenv/internal/snapshot"
	"github.com/agentenv/agentenv/internal/template"
)

// backend is the Backend as the request's caller may use it: the whole of
// it for the single key and the operator, and for a named key a view of
// its own sandboxes and snapshots (owned). Every route goes through it, in
// `agentenv serve` and `agentenv api` alike.
func (s *Server) backend(r *http.Request) Backend {
	id := identityOf(r.Context())
	if id.all() {
		return s.cfg.Backend
	}
	return &owned{Backend: s.cfg.Backend, owner: id.Name}
}

// owned is a named key's view of a Backend. Another key's sandbox or
// snapshot does not exist to it (ErrNotFound, as an unknown ID: a key
// learns nothing of the others). Templates are shared.
type owned struct {
	Backend
	owner string
}

func notFound(id string) error {
	return errdefs.NotFound("sandbox %q does not exist", id)
}

// check returns the sandbox if it is the owner's.
func (o *owned) check(ctx context.Context, id string) (sandbox.Sandbox, error) {
	sb, err := o.Backend.Get(ctx, id)
	if err != nil {
		return sb, err
	}
	if sb.Owner != o.owner {
		return sandbox.Sandbox{}, notFound(id)
	}
	return sb, nil
}

func (o *owned) Create(ctx context.Context, req sandbox.CreateRequest) (sandbox.Sandbox, error) {
	req.Owner = o.owner
	return o.Backend.Create(ctx, req)
}

func (o *owned) List(ctx context.Context, f sandbox.Filter) ([]sandbox.Sandbox, error) {
	f.Owner = o.owner
	return o.Backend.List(ctx, f)
}

func (o *owned) Get(ctx context.Context, id string) (sandbox.Sandbox, error) {
	return o.check(ctx, id)
}

func (o *owned) Kill(ctx context.Context, id string) error {
	if _, err := o.check(ctx, id); err != nil {
		return err
	}
	return o.Backend.Kill(ctx, id)
}

func (o *owned) Metrics(ctx context.Context, id string) (sandbox.Metric, error) {
	if _, err := o.check(ctx, id); err != nil {
		return sandbox.Metric{}, err
	}
	return o.Backend.Metrics(ctx, id)
}

// then runs f on sandbox id if it is the owner's.
func then[T any](o *owned, ctx context.Context, id string, f func() (T, error)) (T, error) {
	if _, err := o.check(ctx, id); err != nil {
		var zero T
		return zero, err
	}
	return f()
}

func (o *owned) SetTimeout(ctx context.Context, id string, d time.Duration) (sandbox.Sandbox, error) {
	return then(o, ctx, id, func() (sandbox.Sandbox, error) { return o.Backend.SetTimeout(ctx, id, d) })
}

func (o *owned) Extend(ctx context.Context, id string, d time.Duration) (sandbox.Sandbox, error) {
	return then(o, ctx, id, func() (sandbox.Sandbox, error) { return o.Backend.Extend(ctx, id, d) })
}

func (o *owned) SetNetwork(ctx context.Context, id string, n sandbox.Network) (sandbox.Sandbox, error) {
	return then(o, ctx, id, func() (sandbox.Sandbox, error) { return o.Backend.SetNetwork(ctx, id, n) })
}

func (o *owned) Pause(ctx context.Context, id string) (sandbox.Sandbox, error) {
	return then(o, ctx, id, func() (sandbox.Sandbox, error) { return o.Backend.Pause(ctx, id) })
}

// PauseFiles passes through to a backend that has it.
func (o *owned) PauseFiles(ctx context.Context, id string) (sandbox.Sandbox, error) {
	fp, ok := o.Backend.(FilesPauser)
	if !ok {
		return sandbox.Sandbox{}, errdefs.Invalid("pause with memory: false is not available on this server (fleet mode): pause with memory")
	}
	return then(o, ctx, id, func() (sandbox.Sandbox, error) { return fp.PauseFiles(ctx, id) })
}

func (o *owned) Resume(ctx context.Context, id string, d time.Duration) (sandbox.Sandbox, error) {
	return then(o, ctx, id, func() (sandbox.Sandbox, error) { return o.Backend.Resume(ctx, id, d) })
}

func (o *owned) Snapshot(ctx context.Context, id string, req sandbox.SnapshotRequest) (snapshot.Snapshot, error) {
	return then(o, ctx, id, func() (snapshot.Snapshot, error) { return o.Backend.Snapshot(ctx, id, req) })
}

func (o *owned) Fork(ctx context.Context, id string, count int, d time.Duration, md map[string]string) ([]sandbox.ForkResult, error) {
	return then(o, ctx, id, func() ([]sandbox.ForkResult, error) { return o.Backend.Fork(ctx, id, count, d, md) })
}

func (o *owned) ListSnapshots(ctx context.Context, sandboxID string) ([]snapshot.Snapshot, error) {
	list, err := o.Backend.ListSnapshots(ctx, sandboxID)
	if err != nil {
		return nil, err
	}
	mine := list[:0:0]
	for _, sn := range list {
		if sn.Owner == o.owner {
			mine = append(mine, sn)
		}
	}
	return mine, nil
}

func (o *owned) snapshot(ctx context.Context, id string) (snapshot.Snapshot, error) {
	sn, err := o.Backend.GetSnapshot(ctx, id)
	if err != nil {
		return sn, err
	}
	if sn.Owner != o.owner {
		return snapshot.Snapshot{}, errdefs.NotFound("snapshot %q does not exist", id)
	}
	return sn, nil
}

func (o *owned) GetSnapshot(ctx context.Context, id string) (snapshot.Snapshot, error) {
	return o.snapshot(ctx, id)
}

func (o *owned) DeleteSnapshot(ctx context.Context, id string) error {
	if _, err := o.snapshot(ctx, id); err != nil {
		return err
	}
	return o.Backend.DeleteSnapshot(ctx, id)
}

// DeleteTemplate deletes a template (shared) or, by its ID, one of the
// owner's snapshots (E2B's SDK deletes snapshots through this route).
func (o *owned) DeleteTemplate(ctx context.Context, name string) error {
	sn, err := o.Backend.GetSnapshot(ctx, name)
	switch {
	case err == nil && sn.Owner != o.owner:
		return errdefs.NotFound("template or snapshot %q does not exist", name)
	case err != nil && !errors.Is(err, errdefs.ErrNotFound):
		return err
	}
	return o.Backend.DeleteTemplate(ctx, name)
}

// Templates are shared: listed, read and built as by any key.
var _ interface {
	ListTemplates(context.Context) ([]TemplateInfo, error)
	BuildTemplate(context.Context, template.BuildRequest, func(template.Progress)) (TemplateInfo, error)
} = (*owned)(nil)
