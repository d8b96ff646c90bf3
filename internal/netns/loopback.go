package netns

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
)

// NewLoopback returns a manager of slots without a network (`serve
// --network none`): a slot is only an address inside cidr, which must lie
// in 127.0.0.0/8, so that a sandbox serving on the host itself (the fake
// runtime of the unprivileged test tier) is reached there with no
// namespace, veth or firewall, and without root. Egress policies are
// accepted and not enforced: there is no isolation.
func NewLoopback(cidr, tag string) (*Manager, error) {
	m, err := NewManager(cidr, tag)
	if err != nil {
		return nil, err
	}
	if !loopback8.Contains(m.base) || !loopback8.Contains(lastAddr(m.CIDR())) {
		return nil, fmt.Errorf("network range %q: --network none wants a range inside 127.0.0.0/8, such as 127.88.0.0/16", cidr)
	}
	m.loopback = true
	return m, nil
}

var loopback8 = &net.IPNet{IP: net.IPv4(127, 0, 0, 0).To4(), Mask: net.CIDRMask(8, 32)}

func lastAddr(n *net.IPNet) net.IP {
	ip := make(net.IP, 4)
	for i := range ip {
		ip[i] = n.IP.To4()[i] | ^n.Mask[i]
	}
	return ip
}

// Loopback reports whether the manager has no network (NewLoopback).
func (m *Manager) Loopback() bool { return m.loopback }

// Exists reports whether a slot's namespace is there (always, for a
// loopback slot): a restarted server adopts only sandboxes whose network
// survived.
func (m *Manager) Exists(s Slot) bool {
	if m != nil && m.loopback {
		return true
	}
	_, err := os.Stat(s.Path())
	return err == nil
}

// SlotOf describes the slot whose namespace path (Slot.Path, a runtime
// spec's NetNS) is path, if it is one of this manager's.
func (m *Manager) SlotOf(path string) (Slot, bool) {
	if filepath.Dir(path) != nsDir {
		return Slot{}, false
	}
	i, ok := parseIndex(filepath.Base(path), m.nsName)
	if !ok || i < 0 || i >= m.max {
		return Slot{}, false
	}
	return m.SlotFor(i), true
}
