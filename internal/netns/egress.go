package netns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"strings"

	"github.com/vishvananda/netlink"
)

// Egress is what a sandbox may reach beyond the host. Allow wins over Deny,
// Deny over Internet: with Internet off, only Allow is reachable; with it
// on, everything but Deny and the blocked networks (Blocked). A blocked
// network is reachable only through an Allow entry that lies inside it
// (allowing 10.1.2.3 or 10.0.0.0/8 opens it, allowing 0.0.0.0/0 does not).
// The host itself and this server's range (other sandboxes) never are.
type Egress struct {
	Internet bool
	Allow    []netip.Prefix
	Deny     []netip.Prefix
}

// defaultBlocked are the networks a sandbox's default egress excludes:
// this-network, private (RFC 1918), shared (CGNAT), loopback, link-local
// (cloud metadata services) and multicast/reserved.
var defaultBlocked = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("224.0.0.0/3"),
}

// Blocked lists the networks default egress excludes: the fixed private
// and special ranges, plus the host's own addresses and directly connected
// subnets as InstallFirewall read them.
func (m *Manager) Blocked() []netip.Prefix {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.blocked == nil {
		return append([]netip.Prefix(nil), defaultBlocked...)
	}
	return append([]netip.Prefix(nil), m.blocked...)
}

// slotLink matches the host-side interfaces of any agentenv server's
// slots (ae-3, aetst-12): their subnets are sandboxes, not the host's
// networks, and another server fences its own in.
var slotLink = regexp.MustCompile(`^ae[a-z0-9]{0,3}-[0-9]+$`)

// redump runs a netlink dump again while links or routes changing at the
// same time interrupt it (another server's slots come and go), whose
// results may be incomplete.
func redump[T any](dump func() (T, error)) (T, error) {
	for try := 0; ; try++ {
		out, err := dump()
		if !errors.Is(err, netlink.ErrDumpInterrupted) || try == 20 {
			return out, err
		}
	}
}

// hostNetworks reads the host's IPv4 addresses and the subnets it reaches
// directly (its addresses' prefixes and the main table's link-scope
// routes), leaving out agentenv slots.
func hostNetworks() ([]netip.Prefix, error) { return redump(readHostNetworks) }

func readHostNetworks() ([]netip.Prefix, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, err
	}
	skip := map[int]bool{}
	for _, l := range links {
		if slotLink.MatchString(l.Attrs().Name) {
			skip[l.Attrs().Index] = true
		}
	}
	var out []netip.Prefix
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return nil, err
	}
	for _, a := range addrs {
		if skip[a.LinkIndex] || a.IPNet == nil {
			continue
		}
		out = append(out, hostPrefixes(a.IPNet)...)
		if a.Peer != nil {
			// A point-to-point link: the peer's prefix is the subnet.
			out = append(out, hostPrefixes(a.Peer)...)
		}
	}
	routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		return nil, err
	}
	for _, r := range routes {
		if skip[r.LinkIndex] || r.Dst == nil || r.Gw != nil || r.Scope != netlink.SCOPE_LINK {
			continue
		}
		ip, ok := netip.AddrFromSlice(r.Dst.IP.To4())
		ones, _ := r.Dst.Mask.Size()
		if !ok || ones == 0 {
			// A default route through a device is not a subnet of the
			// host.
			continue
		}
		out = append(out, netip.PrefixFrom(ip, ones).Masked())
	}
	return out, nil
}

// hostPrefixes returns an address of the host and its subnet (none for a
// /0, which would be everything).
func hostPrefixes(n *net.IPNet) []netip.Prefix {
	ip, ok := netip.AddrFromSlice(n.IP.To4())
	ones, bits := n.Mask.Size()
	if !ok || bits != 32 {
		return nil
	}
	out := []netip.Prefix{netip.PrefixFrom(ip, 32)}
	if ones > 0 {
		out = append(out, netip.PrefixFrom(ip, ones).Masked())
	}
	return out
}

// ParsePrefixes reads CIDRs or plain IPv4 addresses.
func ParsePrefixes(list []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(list))
	for _, s := range list {
		if p, err := netip.ParsePrefix(s); err == nil && p.Addr().Is4() {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil || !a.Is4() {
			return nil, fmt.Errorf("%q is not an IPv4 address or CIDR", s)
		}
		out = append(out, netip.PrefixFrom(a, 32))
	}
	return out, nil
}

func prefixSet(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return "{ " + strings.Join(s, ", ") + " }"
}

// insideAny reports whether p lies inside one of nets.
func insideAny(p netip.Prefix, nets []netip.Prefix) bool {
	for _, n := range nets {
		if n.Bits() <= p.Bits() && n.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

// SetEgress installs (or replaces) the egress policy of a slot, and with
// it whether the slot's DNS forwarder answers (with Internet). The slot's
// own chain also drops anything not sent from the slot's address, so a
// sandbox cannot pass for another. It runs no program: one netlink batch
// (atomic) changes what differs from the slot's current policy, nothing
// when the slot has this policy already.
func (m *Manager) SetEgress(_ context.Context, slot Slot, e Egress) error {
	if m.loopback {
		return nil
	}
	m.fw.RLock()
	defer m.fw.RUnlock()
	want := m.egressSets(e) // against the blocked networks of this table
	r := m.slotRules(slot.Index)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := m.update(slot, r, want, true); err != nil {
		return fmt.Errorf("apply the egress policy of slot %d (is the firewall installed?): %w", slot.Index, err)
	}
	// Names resolve where the internet is reachable (dns.go).
	return m.setDNS(slot, e.Internet)
}

// ClearEgress removes a slot's policy (when its sandbox is gone): its
// traffic is refused and its DNS forwarder answers no more. The slot's chain and sets stay for its next sandbox.
// It is idempotent.
func (m *Manager) ClearEgress(_ context.Context, slot Slot) error {
	if m.loopback {
		return nil
	}
	m.stopDNS(slot)
	m.fw.RLock()
	defer m.fw.RUnlock()
	r := m.slotRules(slot.Index)
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.applied {
		return nil
	}
	b, err := m.newBatch()
	if err == nil {
		b.jump(slot, false)
		err = b.flush()
	}
	if err != nil {
		return fmt.Errorf("remove the egress policy of slot %d: %w", slot.Index, err)
	}
	r.applied = false
	return nil
}
