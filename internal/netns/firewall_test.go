package netns_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"

	"github.com/agentenv/agentenv/internal/netns"
)

// markedDialEnv makes the test binary a helper that dials the address in
// it with the test manager's mark and prints what it read (see
// TestFirewallMarkNeedsRoot).
const markedDialEnv = "AGENTENV_TEST_MARKED_DIAL"

func TestMain(m *testing.M) {
	if addr := os.Getenv(markedDialEnv); addr != "" {
		mgr, err := netns.NewManager(testCIDR, testTag)
		if err == nil {
			var got string
			got, err = read(&net.Dialer{Timeout: 2 * time.Second, Control: mgr.MarkSocket}, addr)
			fmt.Print(got)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestMark(t *testing.T) {
	seen := map[uint32]string{}
	for _, tag := range []string{"", "a", "z", "0", "9", "ut", "tst", "aa", "a0", "999", "zzz"} {
		m, err := netns.NewManager(testCIDR, tag)
		if err != nil {
			t.Fatal(err)
		}
		mark := m.Mark()
		if other, ok := seen[mark]; ok {
			t.Errorf("tags %q and %q share the mark %#x", other, tag, mark)
		}
		seen[mark] = tag
		// Bits that other host software tests (kube-proxy, Tailscale).
		if mark&0xc000 != 0 || mark&0xff0000 == 0x40000 || mark&0xff0000 == 0x80000 {
			t.Errorf("tag %q: mark %#x uses bits kube-proxy or Tailscale test", tag, mark)
		}
		if mark>>24 != 0xae {
			t.Errorf("tag %q: got mark %#x, want 0xae in the top byte", tag, mark)
		}
	}
}

// standIn moves a slot's eth0 into a namespace of its own, addressed as
// the runtime would address the sandbox, and serves "hi" on port 8080
// there: a sandbox without gVisor. Traffic only goes to namespaces the
// test made.
func standIn(t testing.TB, slot netns.Slot) *stand {
	t.Helper()
	runtime.LockOSThread()
	orig, err := vnetns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	defer orig.Close()
	sbx, err := vnetns.New() // the thread is now in it
	if err != nil {
		vnetns.Set(orig)
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	t.Cleanup(func() { sbx.Close() })
	ln, lerr := func() (net.Listener, error) {
		h, err := netlink.NewHandleAt(vnetns.NsHandle(mustPath(t, slot)))
		if err != nil {
			return nil, err
		}
		defer h.Close()
		eth0, err := h.LinkByName(netns.SandboxIf)
		if err != nil {
			return nil, err
		}
		if err := h.LinkSetNsFd(eth0, int(sbx)); err != nil {
			return nil, err
		}
		eth0, err = netlink.LinkByName(netns.SandboxIf)
		if err != nil {
			return nil, err
		}
		for _, l := range []string{"lo", netns.SandboxIf} {
			if l, err := netlink.LinkByName(l); err == nil {
				netlink.LinkSetUp(l)
			}
		}
		if err := netlink.AddrReplace(eth0, &netlink.Addr{IPNet: &net.IPNet{IP: netns.InternalIP, Mask: net.CIDRMask(30, 32)}}); err != nil {
			return nil, err
		}
		if err := netlink.RouteReplace(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: netns.GatewayIP}); err != nil {
			return nil, err
		}
		return net.Listen("tcp", ":8080")
	}()
	if err := vnetns.Set(orig); err != nil {
		// Leave the thread locked: the runtime discards it.
		t.Fatalf("back to the test's namespace: %v", err)
	}
	runtime.UnlockOSThread()
	if lerr != nil {
		t.Fatalf("stand-in sandbox: %v", lerr)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hi"))
			c.Close()
		}
	}()
	return &stand{t: t, ns: sbx}
}

// stand is a stand-in sandbox (standIn).
type stand struct {
	t  testing.TB
	ns vnetns.NsHandle
}

// do runs fn on a thread inside the stand-in's namespace.
func (s *stand) do(fn func() error) error {
	runtime.LockOSThread()
	here, err := vnetns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer here.Close()
	if err := vnetns.Set(s.ns); err != nil {
		runtime.UnlockOSThread()
		return err
	}
	err = fn()
	if serr := vnetns.Set(here); serr != nil {
		// Leave the thread locked: the runtime discards it.
		s.t.Errorf("back to the test's namespace: %v", serr)
		return serr
	}
	runtime.UnlockOSThread()
	return err
}

// read connects from the stand-in to addr and reads what the server
// there says.
func (s *stand) read(addr string) (string, error) {
	var c net.Conn
	err := s.do(func() (err error) {
		c, err = (&net.Dialer{Timeout: 2 * time.Second}).Dial("tcp", addr)
		return err
	})
	if err != nil {
		return "", err
	}
	return readConn(c)
}

func mustPath(t testing.TB, slot netns.Slot) int {
	t.Helper()
	ns, err := vnetns.GetFromPath(slot.Path())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	return int(ns)
}

// read dials addr with d and returns what the server says.
func read(d *net.Dialer, addr string) (string, error) {
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return "", err
	}
	return readConn(c)
}

func readConn(c net.Conn) (string, error) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	b, err := io.ReadAll(c)
	return string(b), err
}

// Only connections with the server's socket mark reach a sandbox: not a
// root process without it, not another user.
func TestFirewallOnlyMarkedConnectionsReachSandboxes(t *testing.T) {
	m := newManager(t)
	ctx := context.Background()
	if err := m.InstallFirewall(ctx); err != nil {
		t.Fatalf("InstallFirewall: %v", err)
	}
	t.Cleanup(func() { m.RemoveFirewall(context.Background()) })
	slot, err := m.Create(ctx, 9)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { m.Delete(context.Background(), slot) })
	if err := m.Activate(ctx, slot); err != nil {
		t.Fatalf("Activate: %v", err)
	}
	standIn(t, slot)
	addr := net.JoinHostPort(slot.SandboxIP.String(), "8080")
	if err := m.SetEgress(ctx, slot, netns.Egress{Internet: true}); err != nil {
		t.Fatal(err)
	}

	marked := &net.Dialer{Timeout: 2 * time.Second, Control: m.MarkSocket}
	if got, err := read(marked, addr); got != "hi" {
		t.Fatalf("marked connection to the stand-in sandbox: got %q (%v), want %q", got, err, "hi")
	}
	if got, err := read(&net.Dialer{Timeout: 2 * time.Second}, addr); err == nil {
		t.Errorf("unmarked connection from root: got %q, want it refused", got)
	}
	other, err := netns.NewManager("10.122.1.0/24", "u")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := read(&net.Dialer{Timeout: 2 * time.Second, Control: other.MarkSocket}, addr); err == nil {
		t.Errorf("connection with another server's mark: got %q, want it refused", got)
	}
	if setpriv, err := exec.LookPath("setpriv"); err == nil {
		nobody := []string{"--reuid=65534", "--regid=65534", "--clear-groups"}
		out, err := exec.Command(setpriv, append(nobody, "/bin/busybox", "nc", "-w", "2", slot.SandboxIP.String(), "8080")...).CombinedOutput()
		if err == nil || strings.Contains(string(out), "hi") {
			t.Errorf("connection from uid 65534: got %q (%v), want it refused", out, err)
		}
		// Even with the mark: CAP_NET_RAW (which ping may have) lets a
		// user set it since Linux 5.17.
		helper := copyExecutable(t)
		cmd := exec.Command(setpriv, append(nobody, "--inh-caps=+net_raw", "--ambient-caps=+net_raw", helper)...)
		cmd.Env = append(os.Environ(), markedDialEnv+"="+addr)
		out, err = cmd.CombinedOutput()
		if err == nil || strings.Contains(string(out), "hi") {
			t.Errorf("marked connection from uid 65534 with CAP_NET_RAW: got %q (%v), want it refused", out, err)
		} else if strings.Contains(string(out), "socket mark") {
			t.Logf("uid 65534 could not set the mark (%s): kernel before 5.17", bytes.TrimSpace(out))
		}
	}

	// Nor does another sandbox, whatever its policy allows.
	slot2, err := m.Create(ctx, 10)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { m.Delete(context.Background(), slot2) })
	if err := m.Activate(ctx, slot2); err != nil {
		t.Fatalf("Activate: %v", err)
	}
	from2 := standIn(t, slot2).read
	all := []netip.Prefix{netip.MustParsePrefix(m.CIDR().String()), netip.MustParsePrefix(slot.SandboxIP.String() + "/32"), netip.MustParsePrefix("0.0.0.0/0")}
	if err := m.SetEgress(ctx, slot2, netns.Egress{Internet: true, Allow: all}); err != nil {
		t.Fatal(err)
	}
	if got, err := from2(addr); err == nil {
		t.Errorf("sandbox %d with allowOut %v connected to sandbox %d: got %q, want it dropped", slot2.Index, all, slot.Index, got)
	}
	// Nor the host through its slot address.
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	hostAddr := net.JoinHostPort(slot2.HostIP.String(), portString(ln))
	if got, err := from2(hostAddr); err == nil {
		t.Errorf("sandbox connected to the host at %s: got %q, want it dropped", hostAddr, got)
	}

	// Still works after all that (nothing was left half-open).
	if got, err := read(marked, addr); got != "hi" {
		t.Errorf("marked connection afterwards: got %q (%v), want %q", got, err, "hi")
	}
}

// copyExecutable copies the test binary where another user can run it.
func copyExecutable(t *testing.T) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for d := dir; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}
	p := filepath.Join(dir, "netns.test")
	if err := os.WriteFile(p, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func portString(ln net.Listener) string {
	_, p, _ := net.SplitHostPort(ln.Addr().String())
	return p
}

// The host's own networks are read at install and blocked by default, as
// are the fixed private ranges; slot interfaces are not the host's.
func TestFirewallBlocksHostNetworks(t *testing.T) {
	m := newManager(t)
	ctx := context.Background()
	const link = "utnet0"
	del := func() {
		if l, err := netlink.LinkByName(link); err == nil {
			netlink.LinkDel(l)
		}
	}
	del()
	// A veth of the host with a public-looking subnet and a link route;
	// it never carries traffic.
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: link}, PeerName: "utnet1"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(del)
	l, err := netlink.LinkByName(link)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := netlink.ParseAddr("198.51.100.1/24")
	if err := netlink.AddrAdd(l, a); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{link, "utnet1"} {
		if l, err := netlink.LinkByName(n); err == nil {
			netlink.LinkSetUp(l)
		}
	}
	_, dst, _ := net.ParseCIDR("203.0.113.0/25")
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: dst, Scope: netlink.SCOPE_LINK}); err != nil {
		t.Fatal(err)
	}
	slot, err := m.Create(ctx, 11)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Delete(context.Background(), slot) })

	if err := m.InstallFirewall(ctx); err != nil {
		t.Fatalf("InstallFirewall: %v", err)
	}
	t.Cleanup(func() { m.RemoveFirewall(context.Background()) })
	blocked := m.Blocked()
	for _, want := range []string{"198.51.100.1/32", "198.51.100.0/24", "203.0.113.0/25", "169.254.0.0/16", "10.0.0.0/8", "100.64.0.0/10"} {
		if !slices.Contains(blocked, netip.MustParsePrefix(want)) {
			t.Errorf("blocked networks %v do not include %s", blocked, want)
		}
	}
	slotNet := netip.PrefixFrom(netip.MustParseAddr(slot.HostIP.String()), 30).Masked()
	if slices.Contains(blocked, slotNet) {
		t.Errorf("blocked networks include the slot's own %s", slotNet)
	}
	// The nftables set holds them too.
	for _, addr := range []string{"198.51.100.77", "203.0.113.5", "169.254.169.254", "100.64.1.1", "192.168.7.7", "172.20.0.1", "127.0.0.1", "224.0.0.251", "0.1.2.3"} {
		if out, err := exec.Command("nft", "get", "element", "inet", "agentenv"+testTag, "blocked", "{ "+addr+" }").CombinedOutput(); err != nil {
			t.Errorf("%s is not in the blocked set: %v: %s", addr, err, out)
		}
	}
	for _, addr := range []string{"198.51.101.1", "8.8.8.8"} {
		if out, err := exec.Command("nft", "get", "element", "inet", "agentenv"+testTag, "blocked", "{ "+addr+" }").CombinedOutput(); err == nil {
			t.Errorf("%s is in the blocked set: %s", addr, out)
		}
	}
}
