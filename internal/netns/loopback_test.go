package netns_test

import (
	"context"
	"testing"

	"github.com/agentenv/agentenv/internal/netns"
)

// A loopback manager needs no root: slots are addresses in 127/8 and
// every network operation is a no-op.
func TestLoopbackSlots(t *testing.T) {
	for _, bad := range []string{"10.88.0.0/16", "126.255.255.0/24", "0.0.0.0/0"} {
		if _, err := netns.NewLoopback(bad, ""); err == nil {
			t.Errorf("NewLoopback(%s) succeeded, want a range inside 127.0.0.0/8 only", bad)
		}
	}
	m, err := netns.NewLoopback("127.88.0.0/20", "lt")
	if err != nil {
		t.Fatal(err)
	}
	if !m.Loopback() || m.Capacity() != 1024 {
		t.Fatalf("loopback %v, capacity %d; want true, 1024", m.Loopback(), m.Capacity())
	}
	ctx := context.Background()
	if err := m.CheckRange(); err != nil {
		t.Errorf("check range: %v", err)
	}
	if err := m.InstallFirewall(ctx); err != nil {
		t.Errorf("install firewall: %v", err)
	}
	s, err := m.Create(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.SandboxIP.String(); got != "127.88.0.14" {
		t.Errorf("slot 3's address %s, want 127.88.0.14", got)
	}
	for name, err := range map[string]error{
		"activate": m.Activate(ctx, s), "egress": m.SetEgress(ctx, s, netns.Egress{}),
		"clear egress": m.ClearEgress(ctx, s), "recycle": m.Recycle(ctx, s), "delete": m.Delete(ctx, s),
	} {
		if err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if !m.Exists(s) {
		t.Error("a loopback slot does not exist")
	}
	if got, ok := m.SlotOf(s.Path()); !ok || got.Index != 3 || !got.SandboxIP.Equal(s.SandboxIP) {
		t.Errorf("SlotOf(%s) = %+v, %v; want slot 3", s.Path(), got, ok)
	}
	if _, ok := m.SlotOf("/elsewhere/" + s.Namespace); ok {
		t.Error("SlotOf took a path outside the namespace directory")
	}
	if left, err := m.Leftovers(); err != nil || len(left) != 0 {
		t.Errorf("leftovers %v, %v; want none", left, err)
	}
}
