package sandbox

import (
	"context"
	"errors"
	"testing"

	"github.com/agentenv/agentenv/internal/errdefs"
)

// TestForkAdmission: a fork whose children do not all fit on the node
// (sandbox count, disk budget) is refused as a whole, before any snapshot;
// one that fits is admitted; a count past MaxFork is invalid.
func TestForkAdmission(t *testing.T) {
	m := testManager(t, newFakeRuntime(), 10)
	for range 4 {
		addSandbox(t, m, StateRunning)
	}
	// A budget of 100 MiB: children's layers count as the parent's holds
	// (thin), not at their size.
	m.d.Disk = NewDisk(DiskConfig{Budget: 100 * mib})
	m.d.Disk.Attach(m) // the 4 sandboxes have no write layer (DiskMB 0)

	for _, c := range []struct {
		name   string
		count  int
		diskMB int
		layer  int64 // what the parent's layer holds
		want   error
	}{
		{"fits", 6, 2 << 10, mib, nil},
		{"past max sandboxes", 7, 0, 0, errdefs.ErrResourceExhausted},
		{"past disk budget", 6, 2 << 10, 16 * mib, errdefs.ErrInsufficientStorage},
		{"memory layers", 6, 0, 0, nil},
	} {
		writeLayer(t, m, "parent", c.layer)
		err := m.admitFork(Sandbox{ID: "parent", DiskMB: c.diskMB}, c.count)
		if c.want == nil && err != nil || c.want != nil && !errors.Is(err, c.want) {
			t.Errorf("%s: admitFork(%d children of a parent holding %d MiB) = %v, want %v", c.name, c.count, c.layer>>20, err, c.want)
		}
	}
	if got := m.d.Disk.Use(); got.Pending != 0 {
		t.Errorf("after admission checks: %+v, want nothing reserved", got)
	}
	if _, err := m.Fork(context.Background(), "any", m.d.Limits.MaxFork+1, 0, nil); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("fork of MaxFork+1: %v, want invalid", err)
	}
	if got := DefaultLimits().MaxFork; got != 64 {
		t.Errorf("default MaxFork %d, want 64", got)
	}
}
