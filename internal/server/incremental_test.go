package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/client"
	"github.com/agentenv/agentenv/internal/snapshot"
)

// TestIncrementalSnapshotChain takes a snapshot of a sandbox and then 10
// more along a trajectory, 1 MiB of its memory changed before each, and
// checks that the store holds only what changed (the chunks on disk, each
// counted once), and that the last snapshot restores with its memory
// whole, also after the earlier ones are deleted.
func TestIncrementalSnapshotChain(t *testing.T) {
	e := sharedServer(t)
	ctx := context.Background()
	sb := e.create(t, client.CreateRequest{})
	e.shOK(t, sb, "dd if=/dev/urandom of=/dev/shm/state bs=1M count=16 2>/dev/null")
	var snaps []client.Snapshot
	t.Cleanup(func() {
		for _, sn := range snaps {
			e.client.DeleteSnapshot(ctx, sn.SnapshotID)
		}
	})
	for i := range 11 {
		if i > 0 {
			e.shOK(t, sb, fmt.Sprintf("dd if=/dev/urandom of=/dev/shm/state bs=1M count=1 seek=%d conv=notrunc 2>/dev/null", i))
		}
		sn, err := e.client.SnapshotSandbox(ctx, sb.SandboxID, "", nil)
		if err != nil {
			t.Fatalf("snapshot %d: %v", i, err)
		}
		t.Logf("snapshot %d: %d bytes, %d stored", i, sn.SizeBytes, sn.StoredBytes)
		snaps = append(snaps, sn)
	}
	want := md5sum(t, e, sb)
	// Where each snapshot's time went (checkpoint, hash, write), for the record.
	if b, err := os.ReadFile(filepath.Join(e.dataDir, "server.log")); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, sb.SandboxID) && strings.Contains(l, "snapshot taken") {
				t.Log(l)
			}
		}
	}

	first := e.chunkBytes(t, snaps[:1])
	beyond := e.chunkBytes(t, snaps) - first
	t.Logf("first snapshot: %.1f MiB of chunks; the 10 after it: %.1f MiB more", mib(first), mib(beyond))
	if beyond > 20<<20 {
		t.Errorf("10 snapshots with 1 MiB changed each stored %.1f MiB beyond the first, want at most 20 MiB", mib(beyond))
	}

	last := snaps[len(snaps)-1].SnapshotID
	for _, sn := range []string{snaps[0].SnapshotID, last} { // stored whole; stored as extents
		start := time.Now()
		restored := e.create(t, client.CreateRequest{TemplateID: sn})
		t.Logf("create from %s: %v", sn, time.Since(start).Round(time.Millisecond))
		e.client.KillSandbox(ctx, restored.SandboxID)
	}
	if got := md5sum(t, e, e.create(t, client.CreateRequest{TemplateID: last})); got != want {
		t.Fatalf("restored /dev/shm/state md5 %s, want %s", got, want)
	}
	for _, sn := range snaps[:len(snaps)-1] {
		if err := e.client.DeleteSnapshot(ctx, sn.SnapshotID); err != nil {
			t.Fatalf("delete %s: %v", sn.SnapshotID, err)
		}
	}
	snaps = snaps[len(snaps)-1:]
	if got := md5sum(t, e, e.create(t, client.CreateRequest{TemplateID: last})); got != want {
		t.Fatalf("after deleting the earlier snapshots: restored md5 %s, want %s", got, want)
	}
}

func md5sum(t *testing.T, e *env, sb client.Sandbox) string {
	t.Helper()
	return strings.Fields(e.shOK(t, sb, "md5sum /dev/shm/state") + " ")[0]
}

// shOK runs script in the sandbox and returns its output; it fails the
// test unless the script exits 0.
func (e *env) shOK(t *testing.T, sb client.Sandbox, script string) string {
	t.Helper()
	res := e.sh(t, sb, script)
	if res.ExitCode != 0 {
		t.Fatalf("%s: exit %d: %s", script, res.ExitCode, res.Stderr)
	}
	return string(res.Stdout)
}

// chunkBytes reads the snapshots' metadata in the server's store and adds
// up the disk the distinct chunks they reference take.
func (e *env) chunkBytes(t *testing.T, snaps []client.Snapshot) int64 {
	t.Helper()
	dir := filepath.Join(e.dataDir, "snapshots")
	seen := map[string]bool{}
	var n int64
	for _, sn := range snaps {
		b, err := os.ReadFile(filepath.Join(dir, "meta", sn.SnapshotID+".json"))
		if err != nil {
			t.Fatal(err)
		}
		var meta snapshot.Snapshot
		if err := json.Unmarshal(b, &meta); err != nil {
			t.Fatal(err)
		}
		for _, f := range meta.Files {
			for _, ext := range f.Extents {
				if seen[ext.Chunk] {
					continue
				}
				seen[ext.Chunk] = true
				st, err := os.Stat(filepath.Join(dir, "chunks", ext.Chunk))
				if err != nil {
					t.Fatal(err)
				}
				n += st.Sys().(*syscall.Stat_t).Blocks * 512 // chunks are sparse
			}
		}
	}
	return n
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// TestIncrementalSnapshotDiskLayer changes 1 MiB of a 16 MiB file in the
// write layer (on disk) between two snapshots: its blocks travel in the
// checkpoint's pages file and must dedupe like memory.
func TestIncrementalSnapshotDiskLayer(t *testing.T) {
	e := sharedServer(t)
	ctx := context.Background()
	sb := e.create(t, client.CreateRequest{})
	e.shOK(t, sb, "dd if=/dev/urandom of=$HOME/layer bs=1M count=16 2>/dev/null && sync")
	var snaps []client.Snapshot
	t.Cleanup(func() {
		for _, sn := range snaps {
			e.client.DeleteSnapshot(ctx, sn.SnapshotID)
		}
	})
	for i := range 2 {
		if i > 0 {
			e.shOK(t, sb, "dd if=/dev/urandom of=$HOME/layer bs=1M count=1 seek=5 conv=notrunc 2>/dev/null && sync")
		}
		sn, err := e.client.SnapshotSandbox(ctx, sb.SandboxID, "", nil)
		if err != nil {
			t.Fatalf("snapshot %d: %v", i, err)
		}
		t.Logf("snapshot %d: %d bytes, %d stored", i, sn.SizeBytes, sn.StoredBytes)
		snaps = append(snaps, sn)
	}
	if snaps[0].SizeBytes < 16<<20 {
		t.Errorf("first snapshot is %d bytes: the 16 MiB written to the layer are not in it", snaps[0].SizeBytes)
	}
	if got := snaps[1].StoredBytes; got > 4<<20 {
		t.Errorf("snapshot after 1 MiB of the layer changed stored %.1f MiB, want at most 4", mib(got))
	}
	want := e.shOK(t, sb, "md5sum $HOME/layer")
	if got := e.shOK(t, e.create(t, client.CreateRequest{TemplateID: snaps[1].SnapshotID}), "md5sum $HOME/layer"); got != want {
		t.Fatalf("restored layer file md5 %q, want %q", got, want)
	}
}
