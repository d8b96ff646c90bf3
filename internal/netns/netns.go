// Package netns manages per-sandbox network slots and the host firewall.
//
// A slot is a network namespace with two veth pairs:
//
//	sandbox stack ── eth0 ═ gw0 ── (namespace kernel: NAT) ── up0 ═ aeN ── host
//	169.254.0.21/30    169.254.0.22/30            10.88.N.2/30   10.88.N.1/30
//
// eth0 belongs to the sandbox's own network stack (gVisor takes it over
// when the sandbox starts), so every sandbox sees the same address and
// gateway and a snapshot restores in any slot. The namespace's kernel
// translates between that fixed address and the slot's unique address
// 10.88.N.2, which is what the host and the proxy use. gw0 and up0 stay
// unaddressed until the sandbox has started (Activate), because the runtime
// takes every interface that is up and has an address; they are up from
// the start (and the namespace has no IPv6) so that no carrier change
// happens on the create path.
//
// It must not know about sandboxes or runtimes; callers own slot indexes.
package netns

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

const (
	nsPrefix   = "agentenv-"
	linkPrefix = "ae"
	// nsDir holds the namespaces' bind mounts. It is not iproute2's
	// /run/netns: `ip netns add` may bind-mount that directory over itself,
	// which hides (and leaks) mounts made there before.
	nsDir = "/run/agentenv/netns"
	// SandboxIf is the sandbox's interface inside the namespace.
	SandboxIf = "eth0"
	gatewayIf = "gw0"
	uplinkIf  = "up0"
)

// The address and gateway every sandbox sees.
var (
	InternalIP = net.IPv4(169, 254, 0, 21).To4()
	GatewayIP  = net.IPv4(169, 254, 0, 22).To4()
	internal30 = net.CIDRMask(30, 32)
	sandboxMAC = net.HardwareAddr{0x02, 0xae, 0, 0, 0, 0x21}
	gatewayMAC = net.HardwareAddr{0x02, 0xae, 0, 0, 0, 0x22}
)

// Slot is one sandbox's network.
type Slot struct {
	Index     int    `json:"index"`
	Namespace string `json:"namespace"`
	HostIf    string `json:"hostIf"`
	HostIP    net.IP `json:"hostIP"`
	// SandboxIP is the sandbox's address as the host sees it (the slot's
	// unique address; inside, the sandbox is always InternalIP).
	SandboxIP net.IP `json:"sandboxIP"`
}

// Path is the namespace's bind-mount path, for a runtime spec.
func (s Slot) Path() string { return filepath.Join(nsDir, s.Namespace) }

// Manager creates and removes slots inside one IPv4 range.
type Manager struct {
	base   net.IP // first address of the range
	max    int    // number of /30 blocks in the range
	nsName string // namespace name prefix
	ifName string // host interface name prefix
	tag    string

	// fw is held for writing while the firewall table is replaced, for
	// reading while a slot's rules in it change.
	fw sync.RWMutex

	mu      sync.Mutex
	blocked []netip.Prefix // egress exclusions, read by InstallFirewall
	// unreachable: dropped before any egress policy (SetUnreachable).
	unreachable []netip.Prefix
	// rules records each slot's objects in the table (rules.go);
	// installed: by this manager's InstallFirewall.
	rules     map[int]*slotRules
	installed bool
	// loopback: no namespaces, veths or firewall (NewLoopback).
	loopback bool

	// Each slot's DNS forwarder (dns.go) and where they forward to.
	dnsMu     sync.Mutex
	dns       map[int]*forwarder
	resolvers *resolvers
}

// NewManager returns a manager that carves /30 blocks out of cidr
// (for example 10.88.0.0/16: 16384 slots). tag (up to 3 lower-case letters
// or digits) keeps the names of several servers on one host apart; each
// server cleans up only its own.
func NewManager(cidr, tag string) (*Manager, error) {
	if len(tag) > 3 || strings.Trim(tag, "abcdefghijklmnopqrstuvwxyz0123456789") != "" {
		return nil, fmt.Errorf("network tag %q: use up to 3 lower-case letters or digits", tag)
	}
	_, n, err := net.ParseCIDR(cidr)
	if err != nil || n.IP.To4() == nil {
		return nil, fmt.Errorf("network range %q: want an IPv4 CIDR such as 10.88.0.0/16", cidr)
	}
	ones, _ := n.Mask.Size()
	if ones > 28 {
		return nil, fmt.Errorf("network range %q is too small: want /28 or larger", cidr)
	}
	// Names end in "-" + index, so that one server's wildcard (ae-*) never
	// matches another's interfaces (aetst-*).
	m := &Manager{base: n.IP.To4(), max: 1 << (32 - ones) / 4, nsName: nsPrefix, ifName: linkPrefix + tag + "-", tag: tag,
		resolvers: &resolvers{path: hostResolvConf}}
	if tag != "" {
		m.nsName = nsPrefix + tag + "-"
	}
	return m, nil
}

// Capacity is the number of slots the range holds.
func (m *Manager) Capacity() int { return m.max }

// CIDR returns the managed range.
func (m *Manager) CIDR() *net.IPNet {
	bits := 32
	size := m.max * 4
	for size > 1 {
		size >>= 1
		bits--
	}
	return &net.IPNet{IP: m.base, Mask: net.CIDRMask(bits, 32)}
}

func (m *Manager) addr(index, offset int) net.IP {
	v := binary.BigEndian.Uint32(m.base) + uint32(index*4+offset)
	ip := make(net.IP, 4)
	binary.BigEndian.PutUint32(ip, v)
	return ip
}

// SlotFor describes slot index without creating anything.
func (m *Manager) SlotFor(index int) Slot {
	return Slot{
		Index:     index,
		Namespace: m.nsName + strconv.Itoa(index),
		HostIf:    m.ifName + strconv.Itoa(index),
		HostIP:    m.addr(index, 1),
		SandboxIP: m.addr(index, 2),
	}
}

// Create makes slot index ready for a sandbox to start in: the namespace,
// both veth pairs, the sandbox side addressed, the NAT rules, the DNS
// forwarder (answering once SetEgress allows it). On error it removes
// whatever it made.
func (m *Manager) Create(ctx context.Context, index int) (slot Slot, err error) {
	if index < 0 || index >= m.max {
		return Slot{}, fmt.Errorf("slot %d outside the range (capacity %d)", index, m.max)
	}
	slot = m.SlotFor(index)
	if m.loopback {
		return slot, nil
	}
	ns, err := newNamed(slot.Namespace, func() error { return setupInside(slot) })
	if err != nil {
		// Nothing was made; an existing slot of that index is not ours to
		// remove.
		return slot, fmt.Errorf("create network namespace %s: %w", slot.Namespace, err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, m.Delete(context.WithoutCancel(ctx), slot))
		}
	}()
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return slot, err
	}
	defer h.Close()

	// Host side: aeN (root) ═ up0 (namespace).
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: slot.HostIf, MTU: 1500},
		PeerName:      uplinkIf,
		PeerNamespace: netlink.NsFd(int(ns)),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		return slot, fmt.Errorf("create veth %s: %w", slot.HostIf, err)
	}
	host, err := netlink.LinkByName(slot.HostIf)
	if err != nil {
		return slot, err
	}
	if err := netlink.AddrAdd(host, &netlink.Addr{IPNet: &net.IPNet{IP: slot.HostIP, Mask: net.CIDRMask(30, 32)}}); err != nil {
		return slot, fmt.Errorf("address host side %s: %w", slot.HostIf, err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return slot, err
	}
	// Sandbox side: eth0 ═ gw0, both in the namespace.
	// Fixed MACs: a restored sandbox's network stack remembers its
	// gateway's MAC from the snapshot, so every slot's gateway must have
	// the same one (each pair is its own link, so they never meet).
	if err := h.LinkAdd(&netlink.Veth{
		LinkAttrs: netlink.LinkAttrs{Name: SandboxIf, MTU: 1500, HardwareAddr: sandboxMAC},
		PeerName:  gatewayIf, PeerHardwareAddr: gatewayMAC,
	}); err != nil {
		return slot, fmt.Errorf("create sandbox veth: %w", err)
	}
	for _, name := range []string{"lo", gatewayIf, uplinkIf} {
		l, err := h.LinkByName(name)
		if err != nil {
			return slot, err
		}
		if err := h.LinkSetUp(l); err != nil {
			return slot, err
		}
	}
	if err := addressSandboxSide(h); err != nil {
		return slot, err
	}
	m.prepareEgress(slot)
	if _, err := m.forwarderOf(slot); err != nil {
		return slot, err
	}
	return slot, nil
}

// addressSandboxSide gives eth0 the internal address and default route the
// runtime copies into the sandbox (it removes them from eth0 when it takes
// the interface over, so a reused slot needs them again).
func addressSandboxSide(h *netlink.Handle) error {
	eth0, err := h.LinkByName(SandboxIf)
	if err != nil {
		return err
	}
	if err := h.LinkSetUp(eth0); err != nil {
		return err
	}
	if err := h.AddrReplace(eth0, &netlink.Addr{IPNet: &net.IPNet{IP: InternalIP, Mask: internal30}}); err != nil {
		return fmt.Errorf("address sandbox side: %w", err)
	}
	if err := h.RouteReplace(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: GatewayIP}); err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	// A static neighbour entry (the runtime copies it): the sandbox never
	// has to ARP for its gateway, whose MAC is fixed.
	return h.NeighSet(&netlink.Neigh{LinkIndex: eth0.Attrs().Index, Family: netlink.FAMILY_V4,
		State: netlink.NUD_PERMANENT, IP: GatewayIP, HardwareAddr: gatewayMAC})
}

// Readdress gives eth0 its internal address and route again after a
// runtime created a sandbox in the slot without starting it (it took them
// away), so that a later restore finds them.
func (m *Manager) Readdress(_ context.Context, slot Slot) error {
	if m.loopback {
		return nil
	}
	h, err := handleIn(slot)
	if err != nil {
		return err
	}
	defer h.Close()
	return addressSandboxSide(h)
}

// Activate brings up the namespace's side of both veth pairs once the
// sandbox has taken eth0 over: from then on the host reaches the sandbox
// at slot.SandboxIP and the sandbox's traffic leaves through the host.
func (m *Manager) Activate(_ context.Context, slot Slot) error {
	if m.loopback {
		return nil
	}
	h, err := handleIn(slot)
	if err != nil {
		return err
	}
	defer h.Close()
	if eth0, err := h.LinkByName(SandboxIf); err == nil {
		// The runtime usually removes them; make sure the kernel holds no
		// address of the sandbox, or it would answer for it.
		addrs, _ := h.AddrList(eth0, netlink.FAMILY_V4)
		for _, a := range addrs {
			h.AddrDel(eth0, &a)
		}
	}
	gw, err := h.LinkByName(gatewayIf)
	if err != nil {
		return err
	}
	if err := h.AddrReplace(gw, &netlink.Addr{IPNet: &net.IPNet{IP: GatewayIP, Mask: internal30}}); err != nil {
		return fmt.Errorf("address gateway: %w", err)
	}
	// Nor does the namespace kernel ARP for the sandbox: a restored
	// sandbox may miss the first request, which costs a 1 s retry.
	if err := h.NeighSet(&netlink.Neigh{LinkIndex: gw.Attrs().Index, Family: netlink.FAMILY_V4,
		State: netlink.NUD_PERMANENT, IP: InternalIP, HardwareAddr: sandboxMAC}); err != nil {
		return fmt.Errorf("neighbour entry for the sandbox: %w", err)
	}
	up, err := h.LinkByName(uplinkIf)
	if err != nil {
		return err
	}
	if err := h.AddrReplace(up, &netlink.Addr{IPNet: &net.IPNet{IP: slot.SandboxIP, Mask: net.CIDRMask(30, 32)}}); err != nil {
		return fmt.Errorf("address uplink: %w", err)
	}
	if err := h.RouteReplace(&netlink.Route{LinkIndex: up.Attrs().Index, Gw: slot.HostIP}); err != nil {
		return fmt.Errorf("namespace default route: %w", err)
	}
	// Permanent neighbour entries both ways on the host link: no ARP on
	// the host link either; setting one replaces a stale entry for the
	// address (left by a packet to the previous sandbox, whose ARP retry
	// would cost 1 s) without a dump of the host's neighbour table; and
	// permanent entries are exempt from the
	// kernel's neighbour garbage collection, whose table (gc_thresh3 =
	// 1024 entries for all namespaces) overflowed at ~500 sandboxes with
	// two dynamic entries each, leaving the longest-idle unreachable.
	host, err := netlink.LinkByName(slot.HostIf)
	if err != nil {
		return err
	}
	if err := h.NeighSet(&netlink.Neigh{LinkIndex: up.Attrs().Index, Family: netlink.FAMILY_V4,
		State: netlink.NUD_PERMANENT, IP: slot.HostIP, HardwareAddr: host.Attrs().HardwareAddr}); err != nil {
		return fmt.Errorf("neighbour entry for the host: %w", err)
	}
	if err := netlink.NeighSet(&netlink.Neigh{LinkIndex: host.Attrs().Index, Family: netlink.FAMILY_V4,
		State: netlink.NUD_PERMANENT, IP: slot.SandboxIP, HardwareAddr: up.Attrs().HardwareAddr}); err != nil {
		return fmt.Errorf("neighbour entry for the slot: %w", err)
	}
	return nil
}

// setupInside runs inside the new namespace (on a locked thread): it turns
// on forwarding and installs the NAT between the fixed internal address
// and the slot's address, plus anti-spoofing (addSlotTable).
func setupInside(slot Slot) error {
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		return fmt.Errorf("enable forwarding in the namespace: %w", err)
	}
	// No IPv6 here: an interface that is up gets a link-local address,
	// and the runtime takes every interface with an address. Without it,
	// gw0 and up0 can be up from the start and stay up (a carrier change
	// takes effect only when the kernel's link watcher runs, up to 1 s
	// later, and drops packets until then).
	for _, f := range []string{"all", "default"} {
		if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+f+"/disable_ipv6", []byte("1"), 0o644); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("disable IPv6 in the namespace: %w", err)
		}
	}
	// Through netlink from this thread, which is in the namespace: one
	// batch, no nft process.
	if err := addSlotTable(slot); err != nil {
		return fmt.Errorf("install the namespace's firewall: %w", err)
	}
	return nil
}

// CheckRange fails if a route outside this manager's own interfaces covers
// part of its range: another agentenv server or another network would then
// receive sandbox traffic.
func (m *Manager) CheckRange() error {
	if m.loopback {
		return nil
	}
	routes, err := redump(func() ([]netlink.Route, error) { return netlink.RouteList(nil, netlink.FAMILY_V4) })
	if err != nil {
		return err
	}
	mine := m.CIDR()
	for _, r := range routes {
		if r.Dst == nil || r.Dst.IP.IsUnspecified() {
			continue
		}
		if !mine.Contains(r.Dst.IP) && !r.Dst.Contains(mine.IP) {
			continue
		}
		name := "?"
		if l, err := netlink.LinkByIndex(r.LinkIndex); err == nil {
			name = l.Attrs().Name
		}
		if _, ok := parseIndex(name, m.ifName); ok {
			continue
		}
		return fmt.Errorf("network range %s overlaps the host route %s dev %s (another agentenv server, or a network of this host): choose another --network-cidr (and --network-tag)", mine, r.Dst, name)
	}
	return nil
}

// Delete removes a slot's veth pair and namespace. Missing parts are not an
// error, so Delete is safe to call on a half-made slot.
func (m *Manager) Delete(_ context.Context, slot Slot) error {
	if m.loopback {
		return nil
	}
	var errs []error
	m.closeDNS(slot)
	if err := m.removeEgress(slot); err != nil {
		errs = append(errs, err)
	}
	if l, err := netlink.LinkByName(slot.HostIf); err == nil {
		if err := netlink.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("delete veth %s: %w", slot.HostIf, err))
		}
	}
	if err := deleteNamed(slot.Namespace); err != nil {
		errs = append(errs, fmt.Errorf("delete namespace %s: %w", slot.Namespace, err))
	}
	return errors.Join(errs...)
}

// Leftovers lists the slot indexes that exist on the host (namespaces or
// host-side veths), for cleanup after a crash.
func (m *Manager) Leftovers() ([]int, error) {
	if m.loopback {
		return nil, nil
	}
	seen := map[int]bool{}
	entries, err := os.ReadDir(nsDir)
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	for _, e := range entries {
		if i, ok := parseIndex(e.Name(), m.nsName); ok {
			seen[i] = true
		}
	}
	links, err := redump(netlink.LinkList)
	if err != nil {
		return nil, err
	}
	for _, l := range links {
		if i, ok := parseIndex(l.Attrs().Name, m.ifName); ok {
			seen[i] = true
		}
	}
	out := make([]int, 0, len(seen))
	for i := range seen {
		out = append(out, i)
	}
	sort.Ints(out)
	return out, nil
}

func parseIndex(name, prefix string) (int, bool) {
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return 0, false
	}
	// Digits only, so that prefix "ae" does not claim "aeabx1".
	i, err := strconv.Atoi(rest)
	return i, err == nil && i >= 0
}

// newNamed creates a network namespace kept alive by a bind mount at
// nsDir/name and runs inside() in it, without leaving the calling
// goroutine's thread inside it.
func newNamed(name string, inside func() error) (vnetns.NsHandle, error) {
	if err := os.MkdirAll(nsDir, 0o755); err != nil {
		return 0, err
	}
	path := filepath.Join(nsDir, name)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return 0, err
	}
	f.Close()

	runtime.LockOSThread()
	orig, err := vnetns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		os.Remove(path)
		return 0, err
	}
	defer orig.Close()
	err = unix.Unshare(unix.CLONE_NEWNET)
	mounted := false
	if err == nil {
		src := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		err = unix.Mount(src, path, "none", unix.MS_BIND, "")
		mounted = err == nil
	}
	if err == nil && inside != nil {
		// Sockets opened here (netlink) belong to the new namespace.
		err = inside()
	}
	if serr := vnetns.Set(orig); serr != nil {
		// The thread is stuck in the wrong namespace: keep it locked so the
		// Go runtime discards it when this goroutine ends.
		return 0, errors.Join(err, serr)
	}
	runtime.UnlockOSThread()
	if err != nil {
		if mounted {
			unix.Unmount(path, unix.MNT_DETACH)
		}
		os.Remove(path)
		return 0, err
	}
	return vnetns.GetFromPath(path)
}

func deleteNamed(name string) error {
	path := filepath.Join(nsDir, name)
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// flushNeighbours deletes the neighbour (ARP) entries of a link; h nil
// means the host's namespace.
func flushNeighbours(h *netlink.Handle, link string) {
	if h == nil {
		h = &netlink.Handle{}
	}
	l, err := h.LinkByName(link)
	if err != nil {
		return
	}
	neighs, err := h.NeighList(l.Attrs().Index, netlink.FAMILY_V4)
	if err != nil {
		return
	}
	for _, n := range neighs {
		h.NeighDel(&n)
	}
}

// handleIn returns a netlink handle working inside a slot's namespace.
func handleIn(slot Slot) (*netlink.Handle, error) {
	ns, err := vnetns.GetFromPath(slot.Path())
	if err != nil {
		return nil, fmt.Errorf("open network namespace %s: %w", slot.Namespace, err)
	}
	defer ns.Close()
	return netlink.NewHandleAt(ns)
}
