package node

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/fleet/fleettest"
	"github.com/agentenv/agentenv/internal/fleet/store"
	"github.com/agentenv/agentenv/internal/volume"
)

// A peer's description of a snapshot names the volumes it mounted and
// its owner: neither is taken from it. The mounts are found again by
// volume ID in this node's store (its directory, whatever source the
// peer named: "/", a symlink out of the volume), the owner is the
// request's; a volume this node does not hold for that owner, a volume
// directory that leads out of the store, or a key asking for another's
// snapshot is refused and stores nothing. The lying peer is found as a
// create finds it: through its records in etcd.
func TestCopySnapshotTakesNoMountOrOwnerFromPeer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded etcd")
	}
	ps := newPeerSetup(t)
	ctx := context.Background()
	want := ps.snaps[1]
	cli := fleettest.Etcd(t)
	ps.node.cli = cli
	for key, v := range map[string]any{
		store.NodesPrefix + ps.rec.Name:                ps.rec,
		store.SnapPrefix + want.ID + "/" + ps.rec.Name: store.SnapshotOf(want),
	} {
		sealed, err := ps.node.seal.Seal(key, v)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(ctx, key, sealed); err != nil {
			t.Fatal(err)
		}
	}
	vols, err := volume.Open(volume.Config{Dir: filepath.Join(t.TempDir(), "volumes")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(vols.Close)
	ps.node.host.Volumes = vols
	alices, err := vols.Create("alice", "work")
	if err != nil {
		t.Fatal(err)
	}
	bobs, err := vols.Create("bob", "bobs")
	if err != nil {
		t.Fatal(err)
	}
	// A sandbox mounting alice's volume may leave a symlink in it.
	escape := filepath.Join(vols.DataDir(alices.ID), "escape")
	if err := os.Symlink("/", escape); err != nil {
		t.Fatal(err)
	}
	// A volume whose data directory was replaced by a link out of the
	// store.
	linked, err := vols.Create("alice", "linked")
	if err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(t.TempDir(), "host-dir")
	os.MkdirAll(outside, 0o755)
	os.Remove(vols.DataDir(linked.ID))
	if err := os.Symlink(outside, vols.DataDir(linked.ID)); err != nil {
		t.Fatal(err)
	}
	wantSrc, _ := filepath.EvalSymlinks(vols.DataDir(alices.ID))

	lie := func(owner string, mounts ...volume.Mount) func(string) any {
		return func(string) any {
			sn := want
			sn.Files, sn.Chunks = maps.Clone(want.Files), maps.Clone(want.Chunks)
			sn.Owner, sn.Volumes = owner, mounts
			return sn
		}
	}
	for _, tc := range []struct {
		name      string
		manifest  func(string) any
		owner     string // the request's
		class     error  // nil: imported
		wantOwner string
	}{
		{name: "source / for a volume of the owner", owner: "alice", wantOwner: "alice",
			manifest: lie("alice", volume.Mount{ID: alices.ID, Name: "work", Path: "/mnt/work", Source: "/"})},
		{name: "source a symlink inside the volume", owner: "alice", wantOwner: "alice",
			manifest: lie("alice", volume.Mount{ID: alices.ID, Name: "etc", Path: "/mnt/work", Source: escape})},
		{name: "source / for a volume this node lacks", owner: "alice", class: errdefs.ErrNotFound,
			manifest: lie("alice", volume.Mount{ID: "00000000-0000-4000-8000-000000000000", Name: "work", Path: "/mnt/work", Source: "/"})},
		{name: "another key's volume", owner: "alice", class: errdefs.ErrNotFound,
			manifest: lie("alice", volume.Mount{ID: bobs.ID, Name: "bobs", Path: "/mnt/work", Source: vols.DataDir(bobs.ID)})},
		{name: "a volume directory that leads out of the store", owner: "alice", class: errdefs.ErrPermissionDenied,
			manifest: lie("alice", volume.Mount{ID: linked.ID, Name: "linked", Path: "/mnt/work", Source: vols.DataDir(linked.ID)})},
		{name: "a mount over the sandbox's /proc", owner: "alice", class: errdefs.ErrUnavailable,
			manifest: lie("alice", volume.Mount{ID: alices.ID, Name: "work", Path: "/proc", Source: "/"})},
		{name: "a source path for an ID", owner: "alice", class: errdefs.ErrUnavailable,
			manifest: lie("alice", volume.Mount{ID: "../../../../", Name: "work", Path: "/mnt/work", Source: "/"})},
		{name: "a key asking for another's snapshot", owner: "bob", class: errdefs.ErrNotFound,
			manifest: lie("alice")},
		{name: "an owner forged for the operator's copy", owner: "", wantOwner: "",
			manifest: lie("alice")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ps.peer.mu.Lock()
			ps.peer.manifest, ps.peer.asked = tc.manifest, map[string]int{}
			ps.peer.mu.Unlock()
			if ps.node.host.SnapshotStore.Has(want.ID) {
				if err := ps.node.host.SnapshotStore.Delete(want.ID); err != nil {
					t.Fatal(err)
				}
			}
			before := files(t, ps.root)
			err := ps.node.ensure(ctx, want.ID, tc.owner)
			if n := ps.peer.requests("snapshots/" + want.ID); n != 1 {
				t.Fatalf("the peer was asked for the description %d times, want 1 (found through etcd)", n)
			}
			if tc.class != nil {
				if !errors.Is(err, tc.class) {
					t.Fatalf("copy: got %v, want an error of class %v", err, tc.class)
				}
				if after := files(t, ps.root); !maps.Equal(after, before) {
					t.Errorf("a refused copy changed files under %s:\nbefore %v\nafter  %v", ps.root, slices.Sorted(maps.Keys(before)), slices.Sorted(maps.Keys(after)))
				}
				if ps.node.host.SnapshotStore.Has(want.ID) {
					t.Errorf("a refused copy left snapshot %s", want.ID)
				}
				return
			}
			if err != nil {
				t.Fatalf("copy: %v", err)
			}
			got, err := ps.node.host.SnapshotStore.Get(want.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got.Owner != tc.wantOwner {
				t.Errorf("imported with owner %q, want %q (the request's)", got.Owner, tc.wantOwner)
			}
			for _, m := range got.Volumes {
				if m.Source != wantSrc || m.Name != "work" || m.ID != alices.ID {
					t.Errorf("imported mount %+v, want volume %s (work) bound from %s", m, alices.ID, wantSrc)
				}
				if _, err := vols.CheckBindSource(m.Source); err != nil {
					t.Errorf("imported mount source %s: %v", m.Source, err)
				}
				if strings.HasPrefix(m.Source, "/etc") || m.Source == "/" {
					t.Errorf("imported mount binds %s of the host", m.Source)
				}
			}
		})
	}
}

// The volume store binds only its own volumes' directories: a path
// outside it, another of its files, or a volume directory that a
// symlink leads out of are refused.
func TestVolumeBindSource(t *testing.T) {
	vols, err := volume.Open(volume.Config{Dir: filepath.Join(t.TempDir(), "volumes")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(vols.Close)
	v, _ := vols.Create("alice", "work")
	src, err := vols.BindSource(v.ID)
	if err != nil {
		t.Fatal(err)
	}
	if id, err := vols.CheckBindSource(src); err != nil || id != v.ID {
		t.Fatalf("CheckBindSource(%s) = %q, %v; want %s", src, id, err, v.ID)
	}
	os.Symlink("/", filepath.Join(src, "escape"))
	for _, p := range []string{"/", "/etc", filepath.Join(src, "escape"), filepath.Join(src, ".."), filepath.Dir(src), filepath.Join(src, "..", "volume.json"), "relative/data"} {
		if _, err := vols.CheckBindSource(p); err == nil {
			t.Errorf("CheckBindSource(%s) accepted it", p)
		}
	}
	os.RemoveAll(src)
	os.Symlink("/etc", src)
	if got, err := vols.BindSource(v.ID); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("BindSource with the data directory a link to /etc: %q, %v; want a refusal", got, err)
	}
	if _, err := vols.CheckBindSource(src); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("CheckBindSource of a data directory linked to /etc: %v; want a refusal", err)
	}
}
