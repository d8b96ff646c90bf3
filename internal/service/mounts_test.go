package service

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/sandbox"
	"github.com/agentenv/agentenv/internal/snapshot"
	"github.com/agentenv/agentenv/internal/volume"
)

// A restore binds the volume directories its snapshot recorded: one that
// records anything but the volume's own directory in this host's store
// (the host's root, a symlink a sandbox left in the volume, another
// volume's directory) is refused before a sandbox starts, as is a create
// whose volume's directory was replaced by a link out of the store.
func TestCreateBindsOnlyVolumeDirectories(t *testing.T) {
	vols, err := volume.Open(volume.Config{Dir: filepath.Join(t.TempDir(), "volumes")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(vols.Close)
	work, _ := vols.Create("alice", "work")
	other, _ := vols.Create("alice", "other")
	escape := filepath.Join(vols.DataDir(work.ID), "escape")
	os.Symlink("/", escape)
	snaps, err := snapshot.Open(filepath.Join(t.TempDir(), "snapshots"))
	if err != nil {
		t.Fatal(err)
	}
	add := func(m volume.Mount) string {
		dir, _ := snaps.TempDir()
		os.WriteFile(filepath.Join(dir, "checkpoint.img"), []byte("state"), 0o600)
		sn, err := snaps.Add(dir, snapshot.Snapshot{Template: "busybox", Owner: "alice", Volumes: []volume.Mount{m}})
		if err != nil {
			t.Fatal(err)
		}
		return sn.ID
	}
	// No Manager: a create that got past the checks would panic.
	l := &Local{SnapshotStore: snaps, Volumes: vols}
	for _, tc := range []struct {
		name  string
		mount volume.Mount
		class error
	}{
		{"the host's root", volume.Mount{ID: work.ID, Name: "work", Path: "/mnt/work", Source: "/"}, errdefs.ErrPermissionDenied},
		{"a symlink inside the volume", volume.Mount{ID: work.ID, Name: "work", Path: "/mnt/work", Source: escape}, errdefs.ErrPermissionDenied},
		{"another volume's directory", volume.Mount{ID: work.ID, Name: "work", Path: "/mnt/work", Source: vols.DataDir(other.ID)}, errdefs.ErrPermissionDenied},
		{"a volume this host lacks", volume.Mount{ID: "00000000-0000-4000-8000-000000000000", Name: "gone", Path: "/mnt/work", Source: "/"}, errdefs.ErrNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := l.Create(context.Background(), sandbox.CreateRequest{Template: add(tc.mount), Owner: "alice"})
			if !errors.Is(err, tc.class) {
				t.Fatalf("restore: got %v, want an error of class %v", err, tc.class)
			}
		})
	}
	t.Run("a create whose volume directory leads out of the store", func(t *testing.T) {
		os.RemoveAll(vols.DataDir(other.ID))
		os.Symlink("/etc", vols.DataDir(other.ID))
		_, err := l.Create(context.Background(), sandbox.CreateRequest{Owner: "alice", Volumes: []volume.Mount{{ID: other.ID, Name: "other", Path: "/mnt/other"}}})
		if !errors.Is(err, errdefs.ErrPermissionDenied) {
			t.Fatalf("create: got %v, want a refusal (permission denied)", err)
		}
	})
}
