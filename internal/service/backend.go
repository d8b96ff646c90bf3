package service

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/sandbox"
	"github.com/agentenv/agentenv/internal/snapshot"
	"github.com/agentenv/agentenv/internal/template"
	"github.com/agentenv/agentenv/internal/volume"
)

// Backend is everything the front ends (REST, SandboxFusion, a fleet
// node's RPC service) ask of sandboxes, snapshots and templates. It is the
// one seam between them and the sandbox logic: Local implements it over
// this host's manager and stores (`agentenv serve`, and each fleet node),
// the fleet's router over the network (`agentenv api`), so every route
// behaves the same in both.
//
// Errors wrap errdefs classes; the front ends map them to HTTP. Every method
// may be called concurrently.
type Backend interface {
	// Create starts a sandbox from a template or a snapshot (req.Template
	// names either). Unknown names are ErrNotFound.
	Create(ctx context.Context, req sandbox.CreateRequest) (sandbox.Sandbox, error)
	// List returns the sandboxes matching f.
	List(ctx context.Context, f sandbox.Filter) ([]sandbox.Sandbox, error)
	// Get returns one sandbox; a killed or unknown one is ErrNotFound (a
	// lost one too, with the reason in the message).
	Get(ctx context.Context, id string) (sandbox.Sandbox, error)
	// Kill stops a sandbox; it is gone when Kill returns.
	Kill(ctx context.Context, id string) error
	// Metrics samples a sandbox's resource use now.
	Metrics(ctx context.Context, id string) (sandbox.Metric, error)
	// SetTimeout makes the sandbox end d from now.
	SetTimeout(ctx context.Context, id string, d time.Duration) (sandbox.Sandbox, error)
	// Extend makes the sandbox live at least d more (never shortens).
	Extend(ctx context.Context, id string, d time.Duration) (sandbox.Sandbox, error)
	// SetNetwork replaces a running sandbox's egress policy.
	SetNetwork(ctx context.Context, id string, n sandbox.Network) (sandbox.Sandbox, error)
	// Pause freezes a running sandbox; Resume continues it (d > 0 sets a
	// new timeout).
	Pause(ctx context.Context, id string) (sandbox.Sandbox, error)
	Resume(ctx context.Context, id string, d time.Duration) (sandbox.Sandbox, error)
	// Connect is E2B's connect, atomic under the sandbox's lock: a paused
	// sandbox is resumed (resumed true; d only lengthens what it had
	// left), a running one lives at least d more (never shortened).
	Connect(ctx context.Context, id string, d time.Duration) (sb sandbox.Sandbox, resumed bool, err error)
	// Snapshot saves a running sandbox; creates may name the snapshot.
	Snapshot(ctx context.Context, id string, req sandbox.SnapshotRequest) (snapshot.Snapshot, error)
	// Fork restores count children of a running sandbox; an error only
	// when no child could be attempted.
	Fork(ctx context.Context, id string, count int, d time.Duration, metadata map[string]string) ([]sandbox.ForkResult, error)
	// ListSnapshots lists the (non-internal) snapshots, of one sandbox when
	// sandboxID is not empty.
	ListSnapshots(ctx context.Context, sandboxID string) ([]snapshot.Snapshot, error)
	GetSnapshot(ctx context.Context, id string) (snapshot.Snapshot, error)
	DeleteSnapshot(ctx context.Context, id string) error
	// ListTemplates lists the templates; GetTemplate returns one.
	ListTemplates(ctx context.Context) ([]TemplateInfo, error)
	GetTemplate(ctx context.Context, name string) (TemplateInfo, error)
	// DeleteTemplate deletes a template, or the snapshot of that ID (E2B's
	// SDK deletes snapshots through the template route).
	DeleteTemplate(ctx context.Context, name string) error
	// BuildTemplate builds (and makes ready) a template. An invalid
	// request fails before progress is first called.
	BuildTemplate(ctx context.Context, req template.BuildRequest, progress func(template.Progress)) (TemplateInfo, error)

	// Volumes. Each call names the owner the caller acts for ("" sees
	// every volume); another owner's volume does not exist to it
	// (ErrNotFound). CreateVolume makes an empty volume (names unique
	// per owner); GetVolume and CreateVolume answer a fresh content token.
	// DeleteVolume is refused (ErrConflict, naming them) while sandboxes
	// mount it. Where a volume's host is away, the calls about it are
	// ErrUnavailable naming the host.
	CreateVolume(ctx context.Context, owner, name string) (VolumeInfo, error)
	ListVolumes(ctx context.Context, owner string) ([]volume.Volume, error)
	GetVolume(ctx context.Context, owner, id string) (VolumeInfo, error)
	// VolumeByName finds the owner's volume called name (a create's
	// volumeMounts name them).
	VolumeByName(ctx context.Context, owner, name string) (volume.Volume, error)
	DeleteVolume(ctx context.Context, owner, id string) error
	// VolumeContent serves one request of E2B's volume content API
	// (/volumecontent/{id}/dir|path|file, authorised by the volume's
	// token, not an API key) where the volume lives, answering in that
	// API's error shape.
	VolumeContent(w http.ResponseWriter, r *http.Request, id string)
}

// MaxBody caps JSON request bodies (the REST API's, and the fleet's
// node calls).
const MaxBody = 1 << 20

// VolumeInfo is a volume and a token for its content API.
type VolumeInfo struct {
	volume.Volume
	Token string
}

// FilesPauser is implemented by backends that can pause a sandbox keeping
// only its files (E2B's pause with memory: false; resume reboots it).
type FilesPauser interface {
	PauseFiles(ctx context.Context, id string) (sandbox.Sandbox, error)
}

// TemplateInfo is a template and whether creates from it restore a
// ready snapshot.
type TemplateInfo struct {
	template.Template
	Ready bool `json:"ready"`
}

// Local is the Backend over this host's sandbox manager and stores.
type Local struct {
	Manager       *sandbox.Manager
	TemplateStore *template.Store
	// SnapshotStore may be nil (snapshots disabled).
	SnapshotStore *snapshot.Store
	// Volumes may be nil (no volumes: the volume routes answer 503).
	Volumes *volume.Store
}

var _ Backend = (*Local)(nil)

func (l *Local) hasSnapshot(id string) bool { return l.SnapshotStore != nil && l.SnapshotStore.Has(id) }

func (l *Local) Create(ctx context.Context, req sandbox.CreateRequest) (sandbox.Sandbox, error) {
	if req.Template != "" && !l.hasSnapshot(req.Template) {
		if _, err := l.TemplateStore.Get(req.Template); err != nil {
			return sandbox.Sandbox{}, err
		}
	}
	if l.hasSnapshot(req.Template) {
		if err := l.checkSnapshotMounts(req.Template); err != nil {
			return sandbox.Sandbox{}, err
		}
	}
	if len(req.Volumes) == 0 {
		return l.Manager.Create(ctx, req)
	}
	release, err := l.mounts(req.Volumes)
	if err != nil {
		return sandbox.Sandbox{}, err
	}
	// Held until the sandbox is registered (or failed): a delete racing
	// the create is refused.
	defer release()
	return l.Manager.Create(ctx, req)
}

// mounts fills in the host directory of each volume to mount (found
// here by ID: a caller never says where on this host a volume is) and
// holds the volumes until release.
func (l *Local) mounts(ms []volume.Mount) (release func(), err error) {
	if l.Volumes == nil {
		return nil, errdefs.Invalid("volume mounts are not enabled on this server (it has no volume store)")
	}
	ids := make([]string, len(ms))
	for i := range ms {
		ids[i] = ms[i].ID
		if ms[i].Source, err = l.Volumes.BindSource(ms[i].ID); err != nil {
			return nil, err
		}
	}
	return l.Volumes.Hold(ids...)
}

// checkSnapshotMounts refuses to restore snapshot id when a volume it
// mounts would bind anything but that volume's directory in this host's
// store (a description written elsewhere, or before sources were
// checked): the restore binds what the snapshot recorded.
func (l *Local) checkSnapshotMounts(id string) error {
	sn, err := l.SnapshotStore.Get(id)
	if err != nil || len(sn.Volumes) == 0 {
		return nil // the restore says what is wrong with it
	}
	for _, m := range sn.Volumes {
		if l.Volumes == nil {
			return errdefs.Invalid("snapshot %s mounts volume '%s', and this server keeps no volumes", id, m.Name)
		}
		if _, err := l.Volumes.Get("", m.ID); err != nil {
			return errdefs.NotFound("volume '%s' that snapshot %s mounted at %s was deleted: the snapshot cannot be restored without it", m.Name, id, m.Path)
		}
		got, err := l.Volumes.CheckBindSource(m.Source)
		if err == nil && got != m.ID {
			err = fmt.Errorf("it binds volume %s's directory: %w", got, errdefs.ErrPermissionDenied)
		}
		if err != nil {
			return fmt.Errorf("snapshot %s: volume '%s' (%s) at %s: not restored: %w", id, m.Name, m.ID, m.Path, err)
		}
	}
	return nil
}

func (l *Local) List(ctx context.Context, f sandbox.Filter) ([]sandbox.Sandbox, error) {
	return l.Manager.List(f), nil
}

func (l *Local) Get(ctx context.Context, id string) (sandbox.Sandbox, error) {
	return l.Manager.Get(id)
}

func (l *Local) Kill(ctx context.Context, id string) error { return l.Manager.Kill(ctx, id) }

func (l *Local) Metrics(ctx context.Context, id string) (sandbox.Metric, error) {
	return l.Manager.Metrics(ctx, id)
}

func (l *Local) SetTimeout(ctx context.Context, id string, d time.Duration) (sandbox.Sandbox, error) {
	return l.Manager.SetTimeout(id, d)
}

func (l *Local) Extend(ctx context.Context, id string, d time.Duration) (sandbox.Sandbox, error) {
	return l.Manager.Extend(id, d)
}

func (l *Local) SetNetwork(ctx context.Context, id string, n sandbox.Network) (sandbox.Sandbox, error) {
	return l.Manager.SetNetwork(ctx, id, n)
}

func (l *Local) Pause(ctx context.Context, id string) (sandbox.Sandbox, error) {
	return l.Manager.Pause(ctx, id)
}

func (l *Local) PauseFiles(ctx context.Context, id string) (sandbox.Sandbox, error) {
	return l.Manager.PauseFiles(ctx, id)
}

func (l *Local) Resume(ctx context.Context, id string, d time.Duration) (sandbox.Sandbox, error) {
	return l.Manager.Resume(ctx, id, d)
}

func (l *Local) Connect(ctx context.Context, id string, d time.Duration) (sandbox.Sandbox, bool, error) {
	return l.Manager.Connect(ctx, id, d)
}

func (l *Local) Snapshot(ctx context.Context, id string, req sandbox.SnapshotRequest) (snapshot.Snapshot, error) {
	return l.Manager.Snapshot(ctx, id, req)
}

func (l *Local) Fork(ctx context.Context, id string, count int, d time.Duration, metadata map[string]string) ([]sandbox.ForkResult, error) {
	return l.Manager.Fork(ctx, id, count, d, metadata)
}

func (l *Local) ListSnapshots(ctx context.Context, sandboxID string) ([]snapshot.Snapshot, error) {
	if l.SnapshotStore == nil {
		return nil, nil
	}
	return l.SnapshotStore.List(sandboxID), nil
}

func (l *Local) GetSnapshot(ctx context.Context, id string) (snapshot.Snapshot, error) {
	if l.SnapshotStore == nil {
		return snapshot.Snapshot{}, errdefs.NotFound("snapshot %q does not exist (snapshots are off on this server)", id)
	}
	return l.SnapshotStore.Get(id)
}

func (l *Local) DeleteSnapshot(ctx context.Context, id string) error {
	return l.Manager.DeleteSnapshot(id)
}

func (l *Local) info(t template.Template) TemplateInfo {
	// In use by the sandboxes a user sees: the server's spares (warm
	// containers, pooled sandboxes) and sandboxes being torn down hold it
	// too, but are not in use.
	t.InUse = max(t.InUse-l.Manager.Unlisted(t.Name), 0)
	return TemplateInfo{Template: t, Ready: l.Manager.IsReady(t.Name)}
}

func (l *Local) ListTemplates(ctx context.Context) ([]TemplateInfo, error) {
	var out []TemplateInfo
	for _, t := range l.TemplateStore.List() {
		out = append(out, l.info(t))
	}
	return out, nil
}

func (l *Local) GetTemplate(ctx context.Context, name string) (TemplateInfo, error) {
	t, err := l.TemplateStore.Get(name)
	if err != nil {
		return TemplateInfo{}, err
	}
	return l.info(t), nil
}

func (l *Local) DeleteTemplate(ctx context.Context, name string) error {
	if l.hasSnapshot(name) {
		return l.Manager.DeleteSnapshot(name)
	}
	return l.Manager.DeleteTemplate(name)
}

func (l *Local) BuildTemplate(ctx context.Context, req template.BuildRequest, progress func(template.Progress)) (TemplateInfo, error) {
	if err := l.TemplateStore.Validate(req); err != nil {
		return TemplateInfo{}, err
	}
	// The template's spares hold it too: they go first (and no new ones
	// are made until the build ends), so only users' sandboxes refuse it.
	defer l.Manager.Rebuilding(req.Name)()
	if err := l.TemplateStore.CanBuild(req.Name); err != nil {
		return TemplateInfo{}, err
	}
	if _, err := l.TemplateStore.Build(ctx, req, progress); err != nil {
		return TemplateInfo{}, err
	}
	progress(template.Progress{Phase: "ready", Percent: 99, Message: "booting once for fast creates"})
	if err := l.Manager.MakeBuiltReady(ctx, req.Name); err != nil {
		return TemplateInfo{}, err
	}
	return l.GetTemplate(ctx, req.Name)
}
