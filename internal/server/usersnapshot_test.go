package server_test

import (
	"context"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/client"
	"github.com/agentenv/agentenv/internal/server"
	"github.com/agentenv/agentenv/internal/snapshot"
)

// A store full of a user's snapshots refuses the next one (507, naming
// the limit and what to delete) and keeps every one the user made, while
// agentenv's own (a fork's checkpoint) still go through and are collected.
func TestUserSnapshotsKeptWhenStoreFull(t *testing.T) {
	e := startServerWith(t, t.TempDir(), "10.130.0.0/20", "usn", func(c *server.Config) {
		c.SnapshotPolicy = snapshot.Policy{MaxCount: 2}
		c.Limits.HotPool = 0
		c.ReadyTemplates, c.WarmPool = false, 0
	})
	t.Cleanup(func() {
		if err := e.stop(); err != nil {
			t.Error(err)
		}
	})
	ctx := context.Background()
	sb := e.create(t, client.CreateRequest{Timeout: new(int64(120))})
	var kept []string
	for _, name := range []string{"first", "second"} {
		sn, err := e.client.SnapshotSandbox(ctx, sb.SandboxID, name, nil)
		if err != nil {
			t.Fatalf("snapshot %s: %v", name, err)
		}
		kept = append(kept, sn.SnapshotID)
	}
	_, err := e.client.SnapshotSandbox(ctx, sb.SandboxID, "third", nil)
	if !isStatus(err, 507) || !strings.Contains(err.Error(), "--snapshot-max-count") || !strings.Contains(err.Error(), "delete") {
		t.Errorf("snapshot in a store full of the user's: %v, want 507 naming --snapshot-max-count and what to delete", err)
	}
	// A fork's checkpoint is agentenv's: not refused, and gone after.
	if kids := e.fork(t, e.client, sb.SandboxID, 1); len(kids) == 1 {
		e.client.KillSandbox(ctx, kids[0].SandboxID)
	}
	list, err := e.client.ListSnapshots(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, sn := range list {
		got[sn.SnapshotID] = true
	}
	for _, id := range kept {
		if !got[id] {
			t.Errorf("the user's snapshot %s is gone from a full store (listed: %v)", id, list)
		}
	}
	if len(list) != len(kept) {
		t.Errorf("listed %d snapshots, want the user's %d", len(list), len(kept))
	}
	// Deleting one makes room.
	if err := e.client.DeleteSnapshot(ctx, kept[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.SnapshotSandbox(ctx, sb.SandboxID, "third", nil); err != nil {
		t.Errorf("snapshot after deleting one: %v", err)
	}
}
