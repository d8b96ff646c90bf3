package gvisorgo

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/agentenv/agentenv/internal/runtime"
	"github.com/agentenv/agentenv/internal/runtime/gvisor"
)

// TestRestoreRescrapesNetwork checkpoints a sandbox in one network namespace
// and restores it in another with other addresses: like `runsc restore`,
// the restored sandbox must use the new namespace's addresses. Both
// runtimes run the same steps, to show they agree.
//
// The namespaces are made here, each with a veth pair whose both ends stay
// inside it, so nothing the sandboxes send leaves them.
func TestRestoreRescrapesNetwork(t *testing.T) {
	e := newEnv(t)
	cli, err := gvisor.New(gvisor.Config{Runsc: e.runsc, Root: filepath.Join(e.dir, "root-cli"), Cgroups: true})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range []runtime.Runtime{e.newRuntime(t, "root-go"), cli} {
		t.Run(fmt.Sprintf("%T", r), func(t *testing.T) {
			ctx := context.Background()
			s := e.spec(t, r)
			s.NetNS = testNetNS(t, fmt.Sprintf("10.251.%d.2/24", 2*i))
			if err := r.Create(ctx, s); err != nil {
				t.Fatal(err)
			}
			x := r.(runtime.Execer)
			if out := mustExec(t, x, s.ID, "ip -4 addr"); !strings.Contains(out, fmt.Sprintf("10.251.%d.2", 2*i)) {
				t.Fatalf("sandbox addresses:\n%s\nwant 10.251.%d.2", out, 2*i)
			}
			img := filepath.Join(s.Dir, "ckpt")
			if err := r.(runtime.Checkpointer).Checkpoint(ctx, s.ID, img); err != nil {
				t.Fatal(err)
			}
			c := e.spec(t, r)
			c.NetNS = testNetNS(t, fmt.Sprintf("10.251.%d.2/24", 2*i+1))
			if err := r.(runtime.Checkpointer).Restore(ctx, c, img); err != nil {
				t.Fatal(err)
			}
			out := mustExec(t, x, c.ID, "ip -4 addr")
			if !strings.Contains(out, fmt.Sprintf("10.251.%d.2", 2*i+1)) || strings.Contains(out, fmt.Sprintf("10.251.%d.2", 2*i)) {
				t.Errorf("restored sandbox addresses:\n%s\nwant 10.251.%d.2 only", out, 2*i+1)
			}
		})
	}
}

// testNetNS makes a network namespace, kept by a bind mount in the test's
// directory, with lo up and a veth pair eth0 (addr) / peer0 inside it, and a
// default route via the first address of addr's subnet. It is removed when
// the test ends.
func testNetNS(t *testing.T, addr string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "netns")
	if err := os.WriteFile(path, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		// This thread enters the new namespace and is never unlocked, so
		// the Go runtime discards it instead of reusing it elsewhere.
		goruntime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		errc <- unix.Mount(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), path, "none", unix.MS_BIND, "")
	}()
	if err := <-errc; err != nil {
		t.Fatalf("new netns: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(path, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", path, err)
		}
	})
	ns, err := vnetns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ip, ipnet, err := net.ParseCIDR(addr)
	if err != nil {
		t.Fatal(err)
	}
	ipnet.IP = ip
	gw := ip.Mask(ipnet.Mask).To4()
	gw[3]++
	err = errors.Join(
		h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "peer0"}),
		setUp(h, "lo"), setUp(h, "peer0"), setUp(h, "eth0"),
	)
	if err == nil {
		link, _ := h.LinkByName("eth0")
		err = errors.Join(
			h.AddrAdd(link, &netlink.Addr{IPNet: ipnet}),
			h.RouteAdd(&netlink.Route{LinkIndex: link.Attrs().Index, Gw: gw}),
		)
	}
	if err != nil {
		t.Fatalf("set up netns %s: %v", path, err)
	}
	return path
}

func setUp(h *netlink.Handle, name string) error {
	link, err := h.LinkByName(name)
	if err != nil {
		return err
	}
	return h.LinkSetUp(link)
}
