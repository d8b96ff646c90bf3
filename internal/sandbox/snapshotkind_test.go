package sandbox

import (
	"testing"

	"github.com/agentenv/agentenv/internal/snapshot"
)

// A user's request makes a snapshot the collector keeps; agentenv's own
// (a fork's checkpoint, a ready template, a fleet fork's) are collected.
func TestSnapshotRequestKind(t *testing.T) {
	for _, c := range []struct {
		name string
		req  SnapshotRequest
		want string
	}{
		{"the snapshot API", SnapshotRequest{Name: "mine"}, snapshot.KindUser},
		{"a fork's checkpoint", SnapshotRequest{internal: true}, snapshot.KindAuto},
		{"a ready template", SnapshotRequest{Name: readyPrefix + "base", internal: true}, snapshot.KindAuto},
		{"a fleet fork spilling over", SnapshotRequest{Automatic: true}, snapshot.KindAuto},
	} {
		if got := c.req.kind(); got != c.want {
			t.Errorf("%s: kind %q, want %q", c.name, got, c.want)
		}
	}
}
