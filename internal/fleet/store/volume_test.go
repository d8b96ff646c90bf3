package store

import (
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/sandbox"
	"github.com/agentenv/agentenv/internal/volume"
)

// TestVolumeRecords: the watch cache keeps sealed volume records by ID,
// ignores one that does not open or names another volume, and scopes
// lookups by owner; name keys cannot collide across owners.
func TestVolumeRecords(t *testing.T) {
	c := &Cache{seal: testSeal, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	c.reset()
	put := func(key string, rec VolumeRecord) {
		val, err := testSeal.Seal(key, rec)
		if err != nil {
			t.Fatal(err)
		}
		c.apply(key, []byte(val), false, 1)
	}
	v1 := VolumeRecord{ID: "v1", Name: "data", Owner: "alice", Node: "n1", Created: time.Now()}
	put(VolumePrefix+"v1", v1)
	put(VolumePrefix+"v2", VolumeRecord{ID: "v1", Name: "moved", Node: "n2"}) // names another volume
	c.apply(VolumePrefix+"v3", []byte(`{"id":"v3","name":"forged","node":"n2"}`), false, 1)
	if got, ok := c.Volume("v1"); !ok || got.Node != "n1" || got.Name != "data" {
		t.Fatalf("Volume(v1) = %+v, %v; want the record on n1", got, ok)
	}
	for _, id := range []string{"v2", "v3"} {
		if _, ok := c.Volume(id); ok {
			t.Errorf("record %s was taken although it does not open or names another volume", id)
		}
	}
	if got := c.Volumes("bob"); len(got) != 0 {
		t.Errorf("bob sees %+v, want none", got)
	}
	if got := c.Volumes(""); len(got) != 1 {
		t.Errorf("the single key sees %d volumes, want 1", len(got))
	}
	c.apply(VolumePrefix+"v1", nil, true, 2)
	if _, ok := c.Volume("v1"); ok {
		t.Error("a deleted record is still there")
	}
	if a, b := VolumeNameKey("a/b", "c"), VolumeNameKey("a", "b/c"); a == b || strings.Count(strings.TrimPrefix(a, VolumeNamePrefix), "/") != 1 {
		t.Errorf("name keys %q and %q: owners must not spill into names", a, b)
	}
	// Records of sandboxes and snapshots carry the mounts without the
	// host directories.
	m := []volume.Mount{{ID: "v1", Name: "data", Path: "/d", Source: "/var/lib/agentenv/volumes/v1/data"}}
	rec := RecordOf("n1", sandbox.Sandbox{ID: "i1", Volumes: m})
	if len(rec.Sandbox.Volumes) != 1 || rec.Sandbox.Volumes[0].Source != "" || rec.Sandbox.Volumes[0].ID != "v1" {
		t.Errorf("sandbox record mounts %+v, want v1 without its host directory", rec.Sandbox.Volumes)
	}
}
