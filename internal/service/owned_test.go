package service

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/sandbox"
	"github.com/agentenv/agentenv/internal/snapshot"
	"github.com/agentenv/agentenv/internal/template"
	"github.com/agentenv/agentenv/internal/volume"
)

// tenantBackend holds one sandbox, snapshot and template of alice's, the
// operator's busybox template and records every call that got past the
// lookups an owner check makes (Get, GetSnapshot, GetTemplate), with the
// owner each volume call was made for.
type tenantBackend struct {
	mu    sync.Mutex
	calls []string
}

var _ Backend = (*tenantBackend)(nil)

const (
	aliceSandbox  = "sb-alice"
	aliceSnapshot = "sn-alice"
	aliceTemplate = "alice-py"
)

func (b *tenantBackend) did(call string) {
	b.mu.Lock()
	b.calls = append(b.calls, call)
	b.mu.Unlock()
}

func (b *tenantBackend) reached() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.calls)
}

func (b *tenantBackend) sb() sandbox.Sandbox {
	return sandbox.Sandbox{ID: aliceSandbox, Owner: "alice", State: sandbox.StatePaused}
}

func (b *tenantBackend) Create(ctx context.Context, req sandbox.CreateRequest) (sandbox.Sandbox, error) {
	b.did("Create for " + req.Owner)
	return sandbox.Sandbox{}, nil
}
func (b *tenantBackend) List(ctx context.Context, f sandbox.Filter) ([]sandbox.Sandbox, error) {
	b.did("List for " + f.Owner)
	return nil, nil
}
func (b *tenantBackend) Get(ctx context.Context, id string) (sandbox.Sandbox, error) {
	if id != aliceSandbox {
		return sandbox.Sandbox{}, errdefs.NotFound("no %s", id)
	}
	return b.sb(), nil
}
func (b *tenantBackend) Kill(ctx context.Context, id string) error { b.did("Kill"); return nil }
func (b *tenantBackend) Metrics(ctx context.Context, id string) (sandbox.Metric, error) {
	b.did("Metrics")
	return sandbox.Metric{}, nil
}
func (b *tenantBackend) SetTimeout(ctx context.Context, id string, d time.Duration) (sandbox.Sandbox, error) {
	b.did("SetTimeout")
	return b.sb(), nil
}
func (b *tenantBackend) Extend(ctx context.Context, id string, d time.Duration) (sandbox.Sandbox, error) {
	b.did("Extend")
	return b.sb(), nil
}
func (b *tenantBackend) SetNetwork(ctx context.Context, id string, n sandbox.Network) (sandbox.Sandbox, error) {
	b.did("SetNetwork")
	return b.sb(), nil
}
func (b *tenantBackend) Pause(ctx context.Context, id string) (sandbox.Sandbox, error) {
	b.did("Pause")
	return b.sb(), nil
}
func (b *tenantBackend) PauseFiles(ctx context.Context, id string) (sandbox.Sandbox, error) {
	b.did("PauseFiles")
	return b.sb(), nil
}
func (b *tenantBackend) Resume(ctx context.Context, id string, d time.Duration) (sandbox.Sandbox, error) {
	b.did("Resume")
	return b.sb(), nil
}
func (b *tenantBackend) Connect(ctx context.Context, id string, d time.Duration) (sandbox.Sandbox, bool, error) {
	b.did("Connect")
	return b.sb(), true, nil
}
func (b *tenantBackend) Snapshot(ctx context.Context, id string, req sandbox.SnapshotRequest) (snapshot.Snapshot, error) {
	b.did("Snapshot")
	return snapshot.Snapshot{}, nil
}
func (b *tenantBackend) Fork(ctx context.Context, id string, count int, d time.Duration, md map[string]string) ([]sandbox.ForkResult, error) {
	b.did("Fork")
	return nil, nil
}
func (b *tenantBackend) ListSnapshots(ctx context.Context, sandboxID string) ([]snapshot.Snapshot, error) {
	return []snapshot.Snapshot{{ID: aliceSnapshot, Owner: "alice"}}, nil
}
func (b *tenantBackend) GetSnapshot(ctx context.Context, id string) (snapshot.Snapshot, error) {
	if id != aliceSnapshot {
		return snapshot.Snapshot{}, errdefs.NotFound("no %s", id)
	}
	return snapshot.Snapshot{ID: aliceSnapshot, Owner: "alice"}, nil
}
func (b *tenantBackend) DeleteSnapshot(ctx context.Context, id string) error {
	b.did("DeleteSnapshot")
	return nil
}
func (b *tenantBackend) templates() []TemplateInfo {
	return []TemplateInfo{
		{Template: template.Template{Name: aliceTemplate, Owner: "alice"}},
		{Template: template.Template{Name: "busybox"}},
	}
}
func (b *tenantBackend) ListTemplates(ctx context.Context) ([]TemplateInfo, error) {
	b.did("ListTemplates")
	return b.templates(), nil
}
func (b *tenantBackend) GetTemplate(ctx context.Context, name string) (TemplateInfo, error) {
	for _, t := range b.templates() {
		if t.Name == name {
			return t, nil
		}
	}
	return TemplateInfo{}, errdefs.NotFound("no %s", name)
}
func (b *tenantBackend) DeleteTemplate(ctx context.Context, name string) error {
	b.did("DeleteTemplate")
	return nil
}
func (b *tenantBackend) BuildTemplate(ctx context.Context, req template.BuildRequest, progress func(template.Progress)) (TemplateInfo, error) {
	b.did("BuildTemplate for " + req.Owner)
	return TemplateInfo{}, nil
}
func (b *tenantBackend) CreateVolume(ctx context.Context, owner, name string) (VolumeInfo, error) {
	b.did("CreateVolume for " + owner)
	return VolumeInfo{}, nil
}
func (b *tenantBackend) ListVolumes(ctx context.Context, owner string) ([]volume.Volume, error) {
	b.did("ListVolumes for " + owner)
	return nil, nil
}
func (b *tenantBackend) GetVolume(ctx context.Context, owner, id string) (VolumeInfo, error) {
	b.did("GetVolume for " + owner)
	return VolumeInfo{}, nil
}
func (b *tenantBackend) VolumeByName(ctx context.Context, owner, name string) (volume.Volume, error) {
	b.did("VolumeByName for " + owner)
	return volume.Volume{}, nil
}
func (b *tenantBackend) DeleteVolume(ctx context.Context, owner, id string) error {
	b.did("DeleteVolume for " + owner)
	return nil
}
func (b *tenantBackend) VolumeContent(w http.ResponseWriter, r *http.Request, id string) {
	b.did("VolumeContent")
}

// TestOwnedChecksEveryMethod walks the whole Backend interface: every
// method must have a row saying what bob's key may do with alice's things
// through it, so a method added to Backend fails here until it is given an
// owner decision. Each row tries alice's sandbox, snapshot, template or
// volumes as bob and says which error class stops it (and that the
// backend's method was never reached) or what reaches the backend.
func TestOwnedChecksEveryMethod(t *testing.T) {
	ctx := context.Background()
	rows := map[string]struct {
		call func(Backend) error
		// want is the error class bob gets (nil: the call goes through).
		want error
		// reach is what the backend must have seen (nil: nothing).
		reach []string
	}{
		"Create": {func(o Backend) error {
			_, err := o.Create(ctx, sandbox.CreateRequest{Template: aliceSnapshot})
			return err
		}, nil, []string{"Create for bob"}},
		"List":       {func(o Backend) error { _, err := o.List(ctx, sandbox.Filter{Owner: "alice"}); return err }, nil, []string{"List for bob"}},
		"Get":        {func(o Backend) error { _, err := o.Get(ctx, aliceSandbox); return err }, errdefs.ErrNotFound, nil},
		"Kill":       {func(o Backend) error { return o.Kill(ctx, aliceSandbox) }, errdefs.ErrNotFound, nil},
		"Metrics":    {func(o Backend) error { _, err := o.Metrics(ctx, aliceSandbox); return err }, errdefs.ErrNotFound, nil},
		"SetTimeout": {func(o Backend) error { _, err := o.SetTimeout(ctx, aliceSandbox, time.Hour); return err }, errdefs.ErrNotFound, nil},
		"Extend":     {func(o Backend) error { _, err := o.Extend(ctx, aliceSandbox, time.Hour); return err }, errdefs.ErrNotFound, nil},
		"SetNetwork": {func(o Backend) error { _, err := o.SetNetwork(ctx, aliceSandbox, sandbox.Network{}); return err }, errdefs.ErrNotFound, nil},
		"Pause":      {func(o Backend) error { _, err := o.Pause(ctx, aliceSandbox); return err }, errdefs.ErrNotFound, nil},
		"Resume":     {func(o Backend) error { _, err := o.Resume(ctx, aliceSandbox, time.Hour); return err }, errdefs.ErrNotFound, nil},
		"Connect":    {func(o Backend) error { _, _, err := o.Connect(ctx, aliceSandbox, 24*time.Hour); return err }, errdefs.ErrNotFound, nil},
		"Snapshot":   {func(o Backend) error { _, err := o.Snapshot(ctx, aliceSandbox, sandbox.SnapshotRequest{}); return err }, errdefs.ErrNotFound, nil},
		"Fork":       {func(o Backend) error { _, err := o.Fork(ctx, aliceSandbox, 1, 0, nil); return err }, errdefs.ErrNotFound, nil},
		"ListSnapshots": {func(o Backend) error {
			list, err := o.ListSnapshots(ctx, "")
			if err == nil && len(list) > 0 {
				return errors.New("listed alice's snapshot")
			}
			return err
		}, nil, nil},
		"GetSnapshot":    {func(o Backend) error { _, err := o.GetSnapshot(ctx, aliceSnapshot); return err }, errdefs.ErrNotFound, nil},
		"DeleteSnapshot": {func(o Backend) error { return o.DeleteSnapshot(ctx, aliceSnapshot) }, errdefs.ErrNotFound, nil},
		// Templates are every key's to use.
		"ListTemplates": {func(o Backend) error { _, err := o.ListTemplates(ctx); return err }, nil, []string{"ListTemplates"}},
		"GetTemplate":   {func(o Backend) error { _, err := o.GetTemplate(ctx, aliceTemplate); return err }, nil, nil},
		"DeleteTemplate": {func(o Backend) error {
			if err := o.DeleteTemplate(ctx, aliceSnapshot); !errors.Is(err, errdefs.ErrNotFound) {
				return errors.New("deleting alice's snapshot: " + errString(err))
			}
			return o.DeleteTemplate(ctx, aliceTemplate)
		}, errdefs.ErrPermissionDenied, nil},
		"BuildTemplate": {func(o Backend) error {
			_, err := o.BuildTemplate(ctx, template.BuildRequest{Name: aliceTemplate}, func(template.Progress) {})
			return err
		}, errdefs.ErrPermissionDenied, nil},
		// Volumes: whatever owner the route names, the call is bob's.
		"CreateVolume": {func(o Backend) error { _, err := o.CreateVolume(ctx, "alice", "v"); return err }, nil, []string{"CreateVolume for bob"}},
		"ListVolumes":  {func(o Backend) error { _, err := o.ListVolumes(ctx, ""); return err }, nil, []string{"ListVolumes for bob"}},
		"GetVolume":    {func(o Backend) error { _, err := o.GetVolume(ctx, "alice", "v"); return err }, nil, []string{"GetVolume for bob"}},
		"VolumeByName": {func(o Backend) error { _, err := o.VolumeByName(ctx, "", "v"); return err }, nil, []string{"VolumeByName for bob"}},
		"DeleteVolume": {func(o Backend) error { return o.DeleteVolume(ctx, "alice", "v") }, nil, []string{"DeleteVolume for bob"}},
		// Authorised by the volume's own token, not by a key.
		"VolumeContent": {func(o Backend) error {
			o.VolumeContent(httptest.NewRecorder(), httptest.NewRequest("GET", "/volumecontent/v/file", nil), "v")
			return nil
		}, nil, []string{"VolumeContent"}},
	}
	bi := reflect.TypeFor[Backend]()
	for i := range bi.NumMethod() {
		m := bi.Method(i).Name
		row, ok := rows[m]
		if !ok {
			t.Errorf("Backend.%s has no row here: decide what a named key may do through it, check it in owned, and add the row", m)
			continue
		}
		be := &tenantBackend{}
		bob := &owned{b: be, owner: "bob"}
		err := row.call(bob)
		switch {
		case row.want == nil && err != nil:
			t.Errorf("bob's %s: got %v, want it to go through", m, err)
		case row.want != nil && !errors.Is(err, row.want):
			t.Errorf("bob's %s on alice's: got %v, want %v", m, err, row.want)
		}
		if got := be.reached(); !slices.Equal(got, row.reach) {
			t.Errorf("bob's %s reached the backend with %q, want %q", m, got, row.reach)
		}
	}
	if len(rows) != bi.NumMethod() {
		t.Errorf("%d rows for %d Backend methods: remove the rows of methods Backend no longer has", len(rows), bi.NumMethod())
	}

	// The optional ability too.
	be := &tenantBackend{}
	if _, err := (&owned{b: be, owner: "bob"}).PauseFiles(ctx, aliceSandbox); !errors.Is(err, errdefs.ErrNotFound) || len(be.reached()) != 0 {
		t.Errorf("bob's PauseFiles on alice's sandbox: got %v (backend saw %q), want not found and nothing reached", err, be.reached())
	}
}

// TestOwnedLetsOwnersThrough: alice's own sandbox and template are hers
// to connect to, rebuild and delete; a new name is anyone's to build.
func TestOwnedLetsOwnersThrough(t *testing.T) {
	ctx := context.Background()
	be := &tenantBackend{}
	alice := &owned{b: be, owner: "alice"}
	if _, resumed, err := alice.Connect(ctx, aliceSandbox, time.Minute); err != nil || !resumed {
		t.Errorf("alice connects to her sandbox: got resumed %v, %v; want resumed", resumed, err)
	}
	if _, err := alice.BuildTemplate(ctx, template.BuildRequest{Name: aliceTemplate}, func(template.Progress) {}); err != nil {
		t.Errorf("alice rebuilds her template: %v", err)
	}
	if err := alice.DeleteTemplate(ctx, aliceTemplate); err != nil {
		t.Errorf("alice deletes her template: %v", err)
	}
	bob := &owned{b: be, owner: "bob"}
	if _, err := bob.BuildTemplate(ctx, template.BuildRequest{Name: "bobs"}, func(template.Progress) {}); err != nil {
		t.Errorf("bob builds a new name: %v", err)
	}
	if _, err := bob.BuildTemplate(ctx, template.BuildRequest{Name: "busybox"}, func(template.Progress) {}); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("bob rebuilds the operator's busybox: got %v, want permission denied", err)
	}
	want := []string{"Connect", "BuildTemplate for alice", "DeleteTemplate", "BuildTemplate for bob"}
	if got := be.reached(); !slices.Equal(got, want) {
		t.Errorf("backend saw %q, want %q", got, want)
	}
}

func errString(err error) string {
	if err == nil {
		return "no error"
	}
	return err.Error()
}
