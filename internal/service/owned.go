package service

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/sandbox"
	"github.com/agentenv/agentenv/internal/snapshot"
	"github.com/agentenv/agentenv/internal/template"
	"github.com/agentenv/agentenv/internal/volume"
)

// Owned is a named key's view of b: owner's sandboxes, snapshots and
// volumes, every template to use and owner's own templates to change.
func Owned(b Backend, owner string) Backend { return &owned{b: b, owner: owner} }

// owned is a named key's view of a Backend. Another key's sandbox,
// snapshot or volume does not exist to it (ErrNotFound, as an unknown ID:
// a key learns nothing of the others). Templates are everyone's to use,
// their owner's to change (ErrPermissionDenied otherwise).
//
// The Backend is a field, not embedded: a method added to Backend does not
// compile here until it is given an owner check (TestOwnedChecksEveryMethod
// holds each one to it).
type owned struct {
	b     Backend
	owner string
}

var _ Backend = (*owned)(nil)

func notFound(id string) error {
	return errdefs.NotFound("sandbox %q does not exist", id)
}

// check returns the sandbox if it is the owner's.
func (o *owned) check(ctx context.Context, id string) (sandbox.Sandbox, error) {
	sb, err := o.b.Get(ctx, id)
	if err != nil {
		return sb, err
	}
	if sb.Owner != o.owner {
		return sandbox.Sandbox{}, notFound(id)
	}
	return sb, nil
}

// Create makes the sandbox the owner's; a create from another key's
// snapshot is refused by the backend (CreateRequest.Owner).
func (o *owned) Create(ctx context.Context, req sandbox.CreateRequest) (sandbox.Sandbox, error) {
	req.Owner = o.owner
	return o.b.Create(ctx, req)
}

func (o *owned) List(ctx context.Context, f sandbox.Filter) ([]sandbox.Sandbox, error) {
	f.Owner = o.owner
	return o.b.List(ctx, f)
}

func (o *owned) Get(ctx context.Context, id string) (sandbox.Sandbox, error) {
	return o.check(ctx, id)
}

func (o *owned) Kill(ctx context.Context, id string) error {
	if _, err := o.check(ctx, id); err != nil {
		return err
	}
	return o.b.Kill(ctx, id)
}

func (o *owned) Metrics(ctx context.Context, id string) (sandbox.Metric, error) {
	if _, err := o.check(ctx, id); err != nil {
		return sandbox.Metric{}, err
	}
	return o.b.Metrics(ctx, id)
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
	return then(o, ctx, id, func() (sandbox.Sandbox, error) { return o.b.SetTimeout(ctx, id, d) })
}

func (o *owned) Extend(ctx context.Context, id string, d time.Duration) (sandbox.Sandbox, error) {
	return then(o, ctx, id, func() (sandbox.Sandbox, error) { return o.b.Extend(ctx, id, d) })
}

func (o *owned) SetNetwork(ctx context.Context, id string, n sandbox.Network) (sandbox.Sandbox, error) {
	return then(o, ctx, id, func() (sandbox.Sandbox, error) { return o.b.SetNetwork(ctx, id, n) })
}

func (o *owned) Pause(ctx context.Context, id string) (sandbox.Sandbox, error) {
	return then(o, ctx, id, func() (sandbox.Sandbox, error) { return o.b.Pause(ctx, id) })
}

// PauseFiles passes through to a backend that has it.
func (o *owned) PauseFiles(ctx context.Context, id string) (sandbox.Sandbox, error) {
	fp, ok := o.b.(FilesPauser)
	if !ok {
		return sandbox.Sandbox{}, errdefs.Invalid("pause with memory: false is not available on this server (fleet mode): pause with memory")
	}
	return then(o, ctx, id, func() (sandbox.Sandbox, error) { return fp.PauseFiles(ctx, id) })
}

func (o *owned) Resume(ctx context.Context, id string, d time.Duration) (sandbox.Sandbox, error) {
	return then(o, ctx, id, func() (sandbox.Sandbox, error) { return o.b.Resume(ctx, id, d) })
}

// Connect hands out the sandbox's envd token and may resume it: the
// owner's alone.
func (o *owned) Connect(ctx context.Context, id string, d time.Duration) (sandbox.Sandbox, bool, error) {
	if _, err := o.check(ctx, id); err != nil {
		return sandbox.Sandbox{}, false, err
	}
	return o.b.Connect(ctx, id, d)
}

func (o *owned) Snapshot(ctx context.Context, id string, req sandbox.SnapshotRequest) (snapshot.Snapshot, error) {
	return then(o, ctx, id, func() (snapshot.Snapshot, error) { return o.b.Snapshot(ctx, id, req) })
}

func (o *owned) Fork(ctx context.Context, id string, count int, d time.Duration, md map[string]string) ([]sandbox.ForkResult, error) {
	return then(o, ctx, id, func() ([]sandbox.ForkResult, error) { return o.b.Fork(ctx, id, count, d, md) })
}

func (o *owned) ListSnapshots(ctx context.Context, sandboxID string) ([]snapshot.Snapshot, error) {
	list, err := o.b.ListSnapshots(ctx, sandboxID)
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
	sn, err := o.b.GetSnapshot(ctx, id)
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
	return o.b.DeleteSnapshot(ctx, id)
}

// ListTemplates lists every template: each is the key's to use.
func (o *owned) ListTemplates(ctx context.Context) ([]TemplateInfo, error) {
	return o.b.ListTemplates(ctx)
}

func (o *owned) GetTemplate(ctx context.Context, name string) (TemplateInfo, error) {
	return o.b.GetTemplate(ctx, name)
}

// changeable refuses a change of another key's (or the operator's)
// template; a name no template has is the caller's to take.
func (o *owned) changeable(ctx context.Context, name string) error {
	t, err := o.b.GetTemplate(ctx, name)
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		return nil
	case err != nil:
		return err
	}
	return t.ChangeableBy(o.owner)
}

// DeleteTemplate deletes one of the owner's templates or, by its ID, one
// of the owner's snapshots (E2B's SDK deletes snapshots through this
// route).
func (o *owned) DeleteTemplate(ctx context.Context, name string) error {
	sn, err := o.b.GetSnapshot(ctx, name)
	switch {
	case err == nil && sn.Owner != o.owner:
		return errdefs.NotFound("template or snapshot %q does not exist", name)
	case err != nil && !errors.Is(err, errdefs.ErrNotFound):
		return err
	case err != nil:
		if err := o.changeable(ctx, name); err != nil {
			return err
		}
	}
	return o.b.DeleteTemplate(ctx, name)
}

// BuildTemplate builds a template the owner's: a new name, or a rebuild of
// its own. The store checks the owner again as it claims the name.
func (o *owned) BuildTemplate(ctx context.Context, req template.BuildRequest, progress func(template.Progress)) (TemplateInfo, error) {
	req.Owner = o.owner
	if err := o.changeable(ctx, req.Name); err != nil {
		return TemplateInfo{}, err
	}
	return o.b.BuildTemplate(ctx, req, progress)
}

// The volume calls act for the owner, whoever the route named.

func (o *owned) CreateVolume(ctx context.Context, _, name string) (VolumeInfo, error) {
	return o.b.CreateVolume(ctx, o.owner, name)
}

func (o *owned) ListVolumes(ctx context.Context, _ string) ([]volume.Volume, error) {
	return o.b.ListVolumes(ctx, o.owner)
}

func (o *owned) GetVolume(ctx context.Context, _, id string) (VolumeInfo, error) {
	return o.b.GetVolume(ctx, o.owner, id)
}

func (o *owned) VolumeByName(ctx context.Context, _, name string) (volume.Volume, error) {
	return o.b.VolumeByName(ctx, o.owner, name)
}

func (o *owned) DeleteVolume(ctx context.Context, _, id string) error {
	return o.b.DeleteVolume(ctx, o.owner, id)
}

// VolumeContent is authorised by the volume's own token, which names one
// volume, not by an API key: no key's view changes it.
func (o *owned) VolumeContent(w http.ResponseWriter, r *http.Request, id string) {
	o.b.VolumeContent(w, r, id)
}
