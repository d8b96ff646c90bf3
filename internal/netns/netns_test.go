package netns_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"

	"github.com/agentenv/agentenv/internal/netns"
	"github.com/agentenv/agentenv/internal/testenv"
)

// The tests' own range and tag, apart from those of the server tests.
const (
	testCIDR = "10.122.0.0/24"
	testTag  = "ut"
)

func TestNewManager(t *testing.T) {
	tests := []struct {
		cidr, tag string
		capacity  int
		ok        bool
	}{
		{"10.122.0.0/24", "ut", 64, true},
		{"10.88.0.0/16", "", 16384, true},
		{"10.122.0.7/28", "a1", 4, true}, // host bits are ignored
		{"10.122.0.0/29", "ut", 0, false},
		{"10.122.0.0/24", "toolong", 0, false},
		{"10.122.0.0/24", "UT", 0, false},
		{"10.122.0.0/24", "u-t", 0, false},
		{"fd00::/64", "ut", 0, false},
		{"10.122.0.0", "ut", 0, false},
		{"", "ut", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.cidr+"/"+tt.tag, func(t *testing.T) {
			m, err := netns.NewManager(tt.cidr, tt.tag)
			if (err == nil) != tt.ok {
				t.Fatalf("NewManager(%q, %q) = %v, want ok=%v", tt.cidr, tt.tag, err, tt.ok)
			}
			if err != nil {
				return
			}
			if got := m.Capacity(); got != tt.capacity {
				t.Errorf("got capacity %d, want %d", got, tt.capacity)
			}
			_, want, _ := net.ParseCIDR(tt.cidr)
			if got := m.CIDR(); got.String() != want.String() {
				t.Errorf("got CIDR %s, want %s", got, want)
			}
		})
	}
}

func TestSlotFor(t *testing.T) {
	managers := map[string]*netns.Manager{}
	for _, tag := range []string{"", "ut", "u", "abc"} {
		m, err := netns.NewManager(testCIDR, tag)
		if err != nil {
			t.Fatal(err)
		}
		managers[tag] = m
	}
	// Addresses: slot i is the i-th /30; the host takes .1, the sandbox .2.
	tests := []struct {
		index         int
		hostIP, sbxIP string
	}{
		{0, "10.122.0.1", "10.122.0.2"},
		{3, "10.122.0.13", "10.122.0.14"},
		{63, "10.122.0.253", "10.122.0.254"},
	}
	names := map[string]string{}
	for tag, m := range managers {
		for _, tt := range tests {
			s := m.SlotFor(tt.index)
			if s.Index != tt.index || s.HostIP.String() != tt.hostIP || s.SandboxIP.String() != tt.sbxIP {
				t.Errorf("tag %q: SlotFor(%d) = %+v, want host %s sandbox %s", tag, tt.index, s, tt.hostIP, tt.sbxIP)
			}
			if len(s.HostIf) > 15 {
				t.Errorf("interface name %q is longer than IFNAMSIZ-1", s.HostIf)
			}
			suffix := strconv.Itoa(tt.index)
			if !strings.HasSuffix(s.Namespace, suffix) || !strings.HasSuffix(s.HostIf, suffix) {
				t.Errorf("tag %q: SlotFor(%d) names %s, %s do not end with the index", tag, tt.index, s.Namespace, s.HostIf)
			}
			if want := filepath.Join("/run/agentenv/netns", s.Namespace); s.Path() != want {
				t.Errorf("got path %s, want %s", s.Path(), want)
			}
			// Names of different servers (tags) never collide.
			for _, n := range []string{s.Namespace, s.HostIf} {
				if other, ok := names[n]; ok && other != tag {
					t.Errorf("name %s is used by tags %q and %q", n, other, tag)
				}
				names[n] = tag
			}
		}
	}
	// The largest slot of the largest range with the longest tag still
	// fits in an interface name.
	big, err := netns.NewManager("10.0.0.0/8", "abc")
	if err != nil {
		t.Fatal(err)
	}
	if s := big.SlotFor(big.Capacity() - 1); len(s.HostIf) > 15 {
		t.Errorf("interface name %q is longer than IFNAMSIZ-1", s.HostIf)
	}
}

// newManager returns the test manager, with any slot a crashed earlier run
// left behind removed.
func newManager(t *testing.T) *netns.Manager {
	t.Helper()
	testenv.NeedRoot(t)
	m, err := netns.NewManager(testCIDR, testTag)
	if err != nil {
		t.Fatal(err)
	}
	left, err := m.Leftovers()
	if err != nil {
		t.Fatalf("Leftovers: %v", err)
	}
	for _, i := range left {
		m.Delete(context.Background(), m.SlotFor(i))
	}
	return m
}

func hasAddr(addrs []netlink.Addr, ip net.IP, ones int) bool {
	for _, a := range addrs {
		if got, _ := a.Mask.Size(); a.IP.Equal(ip) && got == ones {
			return true
		}
	}
	return false
}

func linkIn(t *testing.T, h *netlink.Handle, name string) netlink.Link {
	t.Helper()
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatalf("%s in the namespace: %v", name, err)
	}
	return l
}

func addrsOf(t *testing.T, h *netlink.Handle, l netlink.Link) []netlink.Addr {
	t.Helper()
	addrs, err := h.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	return addrs
}

func hasDefaultRoute(t *testing.T, h *netlink.Handle, l netlink.Link, gw net.IP) bool {
	t.Helper()
	routes, err := h.RouteList(l, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range routes {
		if (r.Dst == nil || r.Dst.IP.IsUnspecified()) && r.Gw.Equal(gw) {
			return true
		}
	}
	return false
}

func TestCreateDelete(t *testing.T) {
	m := newManager(t)
	ctx := context.Background()
	slot, err := m.Create(ctx, 3)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { m.Delete(ctx, slot) })
	if want := m.SlotFor(3); slot.Namespace != want.Namespace || slot.HostIf != want.HostIf || !slot.HostIP.Equal(want.HostIP) || !slot.SandboxIP.Equal(want.SandboxIP) {
		t.Errorf("Create(3) = %+v, want %+v", slot, want)
	}
	if _, err := os.Stat(slot.Path()); err != nil {
		t.Fatalf("namespace file: %v", err)
	}
	if !strings.HasPrefix(slot.Path(), "/run/agentenv/netns/") {
		t.Errorf("namespace at %s, want it under /run/agentenv/netns", slot.Path())
	}

	host, err := netlink.LinkByName(slot.HostIf)
	if err != nil {
		t.Fatalf("host veth %s: %v", slot.HostIf, err)
	}
	if host.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("host veth %s is down", slot.HostIf)
	}
	addrs, err := netlink.AddrList(host, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	if !hasAddr(addrs, slot.HostIP, 30) {
		t.Errorf("host veth addresses %v, want %s/30", addrs, slot.HostIP)
	}

	ns, err := vnetns.GetFromPath(slot.Path())
	if err != nil {
		t.Fatalf("open namespace: %v", err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	// Every sandbox sees the same address and gateway on eth0; the
	// namespace's own legs (gw0, up0) wait, down and unaddressed, for
	// Activate (the runtime takes over every interface that is up).
	eth0 := linkIn(t, h, netns.SandboxIf)
	if eth0.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("%s in the namespace is down", netns.SandboxIf)
	}
	if addrs := addrsOf(t, h, eth0); !hasAddr(addrs, netns.InternalIP, 30) {
		t.Errorf("%s addresses %v, want %s/30", netns.SandboxIf, addrs, netns.InternalIP)
	}
	if !hasDefaultRoute(t, h, eth0, netns.GatewayIP) {
		t.Errorf("no default route via %s on %s", netns.GatewayIP, netns.SandboxIf)
	}
	if lo := linkIn(t, h, "lo"); lo.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("lo in the namespace is down")
	}
	// gw0 and up0 are up from the start (no carrier change on the create
	// path) but have no address, IPv6 link-local included, so the runtime
	// does not take them.
	for _, name := range []string{"gw0", "up0"} {
		l := linkIn(t, h, name)
		if l.Attrs().Flags&net.FlagUp == 0 {
			t.Errorf("%s is down before Activate", name)
		}
		if v6, err := h.AddrList(l, netlink.FAMILY_V6); err != nil || len(v6) != 0 {
			t.Errorf("%s has IPv6 addresses %v (%v): the runtime would take it", name, v6, err)
		}
		if addrs := addrsOf(t, h, l); len(addrs) != 0 {
			t.Errorf("%s has addresses %v before Activate, want none", name, addrs)
		}
	}

	// Activate (after the runtime took eth0 over): the namespace's legs
	// come up, and its kernel holds no address of the sandbox.
	if err := m.Activate(ctx, slot); err != nil {
		t.Fatalf("Activate: %v", err)
	}
	if addrs := addrsOf(t, h, linkIn(t, h, netns.SandboxIf)); len(addrs) != 0 {
		t.Errorf("%s keeps addresses %v after Activate, want none", netns.SandboxIf, addrs)
	}
	gw := linkIn(t, h, "gw0")
	if addrs := addrsOf(t, h, gw); gw.Attrs().Flags&net.FlagUp == 0 || !hasAddr(addrs, netns.GatewayIP, 30) {
		t.Errorf("gw0 after Activate: up=%v addresses %v, want up with %s/30", gw.Attrs().Flags&net.FlagUp != 0, addrs, netns.GatewayIP)
	}
	up := linkIn(t, h, "up0")
	if addrs := addrsOf(t, h, up); up.Attrs().Flags&net.FlagUp == 0 || !hasAddr(addrs, slot.SandboxIP, 30) {
		t.Errorf("up0 after Activate: up=%v addresses %v, want up with %s/30", up.Attrs().Flags&net.FlagUp != 0, addrs, slot.SandboxIP)
	}
	if !hasDefaultRoute(t, h, up, slot.HostIP) {
		t.Errorf("no default route via %s on up0 after Activate", slot.HostIP)
	}
	// Both ends of the host link know each other permanently: no ARP, and
	// nothing for the kernel's shared neighbour table to evict.
	hostLink, err := netlink.LinkByName(slot.HostIf)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		h    *netlink.Handle
		link int
		ip   net.IP
	}{{"host side", nil, hostLink.Attrs().Index, slot.SandboxIP}, {"namespace side", h, up.Attrs().Index, slot.HostIP}} {
		list := netlink.NeighList
		if c.h != nil {
			list = c.h.NeighList
		}
		neighs, err := list(c.link, netlink.FAMILY_V4)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, n := range neighs {
			if n.IP.Equal(c.ip) {
				found = n.State == netlink.NUD_PERMANENT
			}
		}
		if !found {
			t.Errorf("%s: no permanent neighbour entry for %s (got %v)", c.name, c.ip, neighs)
		}
	}

	left, err := m.Leftovers()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(left, 3) {
		t.Errorf("got leftovers %v, want them to include 3", left)
	}
	if err := m.CheckRange(); err != nil {
		t.Errorf("CheckRange with only our own slot: %v", err)
	}

	if err := m.Delete(ctx, slot); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if _, err := os.Stat(slot.Path()); !os.IsNotExist(err) {
		t.Errorf("namespace file still there after Delete: %v", err)
	}
	if _, err := netlink.LinkByName(slot.HostIf); err == nil {
		t.Errorf("host veth %s still there after Delete", slot.HostIf)
	}
	left, err = m.Leftovers()
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(left, 3) {
		t.Errorf("got leftovers %v after Delete, want no 3", left)
	}
	if err := m.Delete(ctx, slot); err != nil {
		t.Errorf("second Delete: %v, want nil (idempotent)", err)
	}
}

func TestCreateOutOfRange(t *testing.T) {
	m := newManager(t)
	for _, i := range []int{-1, m.Capacity()} {
		if _, err := m.Create(context.Background(), i); err == nil {
			m.Delete(context.Background(), m.SlotFor(i))
			t.Errorf("Create(%d) succeeded, want an error (capacity %d)", i, m.Capacity())
		}
	}
}

// A failed Create must remove only what it made: creating a slot that
// already exists must leave the existing slot working.
func TestCreateExistingSlotKeepsIt(t *testing.T) {
	m := newManager(t)
	ctx := context.Background()
	slot, err := m.Create(ctx, 5)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { m.Delete(ctx, slot) })
	if _, err := m.Create(ctx, 5); err == nil {
		t.Fatal("second Create of slot 5 succeeded, want an error")
	}
	if _, err := os.Stat(slot.Path()); err != nil {
		t.Errorf("the failed second Create removed the existing namespace: %v", err)
	}
	if _, err := netlink.LinkByName(slot.HostIf); err != nil {
		t.Errorf("the failed second Create removed the existing host veth: %v", err)
	}
}

func TestCheckRange(t *testing.T) {
	m := newManager(t)
	if err := m.CheckRange(); err != nil {
		t.Fatalf("CheckRange on a clean host: %v", err)
	}
	tests := []struct {
		name    string
		addr    string
		overlap bool
	}{
		{"inside the range", "10.122.0.200/28", true},
		{"covering the range", "10.122.0.1/16", true},
		{"next to the range", "10.122.1.1/24", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// A veth pair outside the manager's names holds a route of
			// this host that is not ours (dummy links may be missing from
			// the kernel). It never carries traffic.
			const name = "utfor0"
			delLink := func() {
				if l, err := netlink.LinkByName(name); err == nil {
					netlink.LinkDel(l)
				}
			}
			delLink()
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: "utfor1"}); err != nil {
				t.Fatalf("add veth: %v", err)
			}
			t.Cleanup(delLink)
			l, err := netlink.LinkByName(name)
			if err != nil {
				t.Fatal(err)
			}
			peer, err := netlink.LinkByName("utfor1")
			if err != nil {
				t.Fatal(err)
			}
			if err := netlink.LinkSetUp(peer); err != nil {
				t.Fatal(err)
			}
			a, err := netlink.ParseAddr(tt.addr)
			if err != nil {
				t.Fatal(err)
			}
			if err := netlink.AddrAdd(l, a); err != nil {
				t.Fatalf("address dummy link: %v", err)
			}
			if err := netlink.LinkSetUp(l); err != nil {
				t.Fatal(err)
			}
			err = m.CheckRange()
			if got := err != nil; got != tt.overlap {
				t.Fatalf("CheckRange with a route for %s: got %v, want overlap=%v", tt.addr, err, tt.overlap)
			}
			if err != nil && !strings.Contains(err.Error(), name) {
				t.Errorf("CheckRange error %q does not name the interface %s", err, name)
			}
			if err := netlink.LinkDel(l); err != nil {
				t.Fatal(err)
			}
			if err := m.CheckRange(); err != nil {
				t.Errorf("CheckRange after removing the route: %v", err)
			}
		})
	}
}

// Each server cleans up only its own slots: a manager with another tag,
// even one that is a prefix of this one, does not see them.
func TestLeftoversPerTag(t *testing.T) {
	m := newManager(t)
	other, err := netns.NewManager("10.122.1.0/24", "u")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	slot, err := m.Create(ctx, 7)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { m.Delete(ctx, slot) })
	left, err := other.Leftovers()
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(left, 7) {
		t.Errorf("a manager tagged %q lists slot 7 of tag %q as its own leftover (%v)", "u", testTag, left)
	}
	if err := other.CheckRange(); err != nil {
		t.Errorf("CheckRange of a disjoint range: %v", err)
	}
}
