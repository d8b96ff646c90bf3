package netns

import (
	"context"
	"fmt"
	"time"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
)

// ActivateWhenTaken activates slot once something started in it has taken
// its eth0 over, for callers that cannot step in between the start and the
// activation (a build sandbox run through the runsc CLI). The runtime
// removes eth0's address only after it has read every interface, so
// addressing gw0 and up0 from then on cannot make it take them too. It
// returns when the slot is active, or with ctx's error when ctx ends
// first (the slot is then left as it was). One slot serves one sandbox.
func (m *Manager) ActivateWhenTaken(ctx context.Context, slot Slot) error {
	if m.loopback {
		return nil
	}
	ns, err := vnetns.GetFromPath(slot.Path())
	if err != nil {
		return fmt.Errorf("open network namespace %s: %w", slot.Namespace, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	eth0, err := h.LinkByName(SandboxIf)
	if err != nil {
		return fmt.Errorf("slot %d has no %s: %w", slot.Index, SandboxIf, err)
	}
	// Address events wake the wait at once; the ticker is a fallback for
	// a missed event.
	updates := make(chan netlink.AddrUpdate, 16)
	done := make(chan struct{})
	defer close(done)
	subErr := netlink.AddrSubscribeWithOptions(updates, done, netlink.AddrSubscribeOptions{Namespace: &ns})
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	if subErr != nil {
		tick.Reset(20 * time.Millisecond)
	}
	for {
		addrs, err := h.AddrList(eth0, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		if len(addrs) == 0 {
			return m.Activate(ctx, slot)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case _, ok := <-updates:
			if !ok {
				// The subscription ended: the ticker alone wakes us.
				updates = nil
				tick.Reset(20 * time.Millisecond)
			}
		case <-tick.C:
		}
	}
}
