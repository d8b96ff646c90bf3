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
	m.d.Disk = NewDisk(10*gib, nil, nil)
	m.d.Disk.Attach(m) // the 4 sandboxes have no write layer (DiskMB 0)

	for _, c := range []struct {
		name   string
		count  int
		diskMB int
		want   error
	}{
		{"fits", 6, 1 << 10, nil},
		{"past max sandboxes", 7, 0, errdefs.ErrResourceExhausted},
		{"past disk budget", 6, 2 << 10, errdefs.ErrInsufficientStorage},
		{"memory layers", 6, 0, nil},
	} {
		err := m.admitFork(Sandbox{DiskMB: c.diskMB}, c.count)
		if c.want == nil && err != nil || c.want != nil && !errors.Is(err, c.want) {
			t.Errorf("%s: admitFork(%d children of %d MiB) = %v, want %v", c.name, c.count, c.diskMB, err, c.want)
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
