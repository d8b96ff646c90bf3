package netns_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/agentenv/agentenv/internal/netns"
	"github.com/agentenv/agentenv/internal/testenv"
)

// query is a DNS query for name's A record, with ID id.
func query(id uint16, name string) []byte {
	q := binary.BigEndian.AppendUint16(nil, id)
	q = append(q, 0x01, 0, 0, 1, 0, 0, 0, 0, 0, 0) // RD, one question
	for _, l := range splitLabels(name) {
		q = append(q, byte(len(l)))
		q = append(q, l...)
	}
	return append(q, 0, 0, 1, 0, 1)
}

func splitLabels(name string) []string {
	var out []string
	start := 0
	for i := 0; i <= len(name); i++ {
		if i == len(name) || name[i] == '.' {
			out = append(out, name[start:i])
			start = i + 1
		}
	}
	return out
}

// reply is what a DNS answer says: its ID, rcode and the address of its
// one A record, if any (the record is the last 4 bytes).
type reply struct {
	id    uint16
	rcode byte
	addr  string
}

func parseReply(t *testing.T, b []byte) reply {
	t.Helper()
	if len(b) < 12 || b[2]&0x80 == 0 {
		t.Fatalf("not a DNS response: % x", b)
	}
	r := reply{id: binary.BigEndian.Uint16(b), rcode: b[3] & 0x0f}
	if binary.BigEndian.Uint16(b[6:8]) == 1 {
		r.addr = netip.AddrFrom4([4]byte(b[len(b)-4:])).String()
	}
	return r
}

// askUDP sends q from the stand-in to the sandbox's resolver over UDP and
// returns the answer.
func askUDP(s *stand, q []byte) ([]byte, error) {
	var c net.Conn
	if err := s.do(func() (err error) {
		c, err = net.Dial("udp4", net.JoinHostPort(netns.GatewayIP.String(), "53"))
		return err
	}); err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(q); err != nil {
		return nil, err
	}
	buf := make([]byte, 4096)
	n, err := c.Read(buf)
	return buf[:n], err
}

// askTCP does the same over TCP (two-byte length prefix).
func askTCP(s *stand, q []byte) ([]byte, error) {
	var c net.Conn
	if err := s.do(func() (err error) {
		c, err = (&net.Dialer{Timeout: 2 * time.Second}).Dial("tcp4", net.JoinHostPort(netns.GatewayIP.String(), "53"))
		return err
	}); err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(q))), q...)); err != nil {
		return nil, err
	}
	var l [2]byte
	if _, err := io.ReadFull(c, l[:]); err != nil {
		return nil, err
	}
	b := make([]byte, binary.BigEndian.Uint16(l[:]))
	_, err := io.ReadFull(c, b)
	return b, err
}

// A sandbox's resolver is its gateway: the slot's forwarder passes UDP and
// TCP queries to the upstream resolver while the slot may reach the
// internet, and refuses at once when it may not.
func TestDNSForwarder(t *testing.T) {
	m := installed(t)
	ctx := context.Background()
	upstream := testenv.FakeDNS(t, map[string]string{"known.test": "198.51.100.7"})
	if err := m.SetResolvers([]string{upstream.Addr}); err != nil {
		t.Fatal(err)
	}
	slot := createSlot(t, m, 30)
	if err := m.Activate(ctx, slot); err != nil {
		t.Fatalf("Activate: %v", err)
	}
	s := standIn(t, slot)
	if err := m.SetEgress(ctx, slot, netns.Egress{Internet: true}); err != nil {
		t.Fatal(err)
	}
	for _, ask := range []struct {
		name string
		fn   func(*stand, []byte) ([]byte, error)
	}{{"udp", askUDP}, {"tcp", askTCP}} {
		b, err := ask.fn(s, query(0x1234, "known.test"))
		if err != nil {
			t.Fatalf("%s query through the forwarder: %v", ask.name, err)
		}
		if got, want := parseReply(t, b), (reply{id: 0x1234, rcode: 0, addr: "198.51.100.7"}); got != want {
			t.Errorf("%s answer for known.test: got %+v, want %+v", ask.name, got, want)
		}
		b, err = ask.fn(s, query(0x4321, "unknown.test"))
		if err != nil {
			t.Fatalf("%s query through the forwarder: %v", ask.name, err)
		}
		if got, want := parseReply(t, b), (reply{id: 0x4321, rcode: 3}); got != want {
			t.Errorf("%s answer for unknown.test: got %+v, want %+v (NXDOMAIN)", ask.name, got, want)
		}
	}
	if got := upstream.Queries.Load(); got != 4 {
		t.Errorf("upstream answered %d queries, want 4", got)
	}

	// Egress off: refused by the forwarder itself, never sent upstream.
	if err := m.SetEgress(ctx, slot, netns.Egress{}); err != nil {
		t.Fatal(err)
	}
	b, err := askUDP(s, query(7, "known.test"))
	if err != nil {
		t.Fatalf("udp query with egress off: %v, want a REFUSED answer", err)
	}
	if got, want := parseReply(t, b), (reply{id: 7, rcode: 5}); got != want {
		t.Errorf("udp answer with egress off: got %+v, want %+v (REFUSED)", got, want)
	}
	if b, err := askTCP(s, query(8, "known.test")); err == nil {
		t.Errorf("tcp query with egress off: got answer % x, want the connection closed", b)
	}
	if got := upstream.Queries.Load(); got != 4 {
		t.Errorf("with egress off the upstream answered %d queries, want still 4", got)
	}

	// On again, then the sandbox is gone: refused too.
	if err := m.SetEgress(ctx, slot, netns.Egress{Internet: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := askUDP(s, query(9, "known.test")); err != nil {
		t.Fatalf("udp query with egress on again: %v", err)
	}
	if err := m.ClearEgress(ctx, slot); err != nil {
		t.Fatal(err)
	}
	if b, err := askUDP(s, query(10, "known.test")); err != nil || parseReply(t, b).rcode != 5 {
		t.Errorf("udp query after ClearEgress: got % x (%v), want REFUSED", b, err)
	}
}

// With no upstream answering, a query fails at once with SERVFAIL.
func TestDNSForwarderUpstreamDown(t *testing.T) {
	m := installed(t)
	ctx := context.Background()
	// A loopback port with nothing behind it: the upstream refuses.
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := pc.LocalAddr().String()
	pc.Close()
	if err := m.SetResolvers([]string{dead}); err != nil {
		t.Fatal(err)
	}
	slot := createSlot(t, m, 31)
	if err := m.Activate(ctx, slot); err != nil {
		t.Fatalf("Activate: %v", err)
	}
	s := standIn(t, slot)
	if err := m.SetEgress(ctx, slot, netns.Egress{Internet: true}); err != nil {
		t.Fatal(err)
	}
	b, err := askUDP(s, query(11, "known.test"))
	if err != nil {
		t.Fatalf("udp query with the upstream down: %v, want SERVFAIL", err)
	}
	if got, want := parseReply(t, b), (reply{id: 11, rcode: 2}); got != want {
		t.Errorf("answer with the upstream down: got %+v, want %+v (SERVFAIL)", got, want)
	}
}

// What the policy forbids a sandbox is refused at once (a TCP reset, an
// ICMP admin-prohibited), not dropped: a connection fails with "refused"
// or "unreachable", not after its timeout. The blocked destinations are
// routed to a veth of the test that has nobody behind it.
func TestBlockedTrafficIsRefused(t *testing.T) {
	m := newManager(t)
	ctx := context.Background()
	const link = "utdns0"
	del := func() {
		if l, err := netlink.LinkByName(link); err == nil {
			netlink.LinkDel(l)
		}
	}
	del()
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: link}, PeerName: "utdns1"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(del)
	l, err := netlink.LinkByName(link)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := netlink.ParseAddr("198.18.5.1/24")
	if err := netlink.AddrAdd(l, a); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{link, "utdns1"} {
		if l, err := netlink.LinkByName(n); err == nil {
			netlink.LinkSetUp(l)
		}
	}
	// A private network on the link and a public one behind a gateway
	// there (not a subnet of the host, so not blocked by default).
	_, private, _ := net.ParseCIDR("10.123.45.0/24")
	_, public, _ := net.ParseCIDR("203.0.113.0/24")
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: private, Scope: netlink.SCOPE_LINK}); err != nil {
		t.Fatal(err)
	}
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: public, Gw: net.ParseIP("198.18.5.2")}); err != nil {
		t.Fatal(err)
	}
	if err := m.InstallFirewall(ctx); err != nil {
		t.Fatalf("InstallFirewall: %v", err)
	}
	t.Cleanup(func() { m.RemoveFirewall(context.Background()) })
	slot := createSlot(t, m, 32)
	if err := m.Activate(ctx, slot); err != nil {
		t.Fatalf("Activate: %v", err)
	}
	s := standIn(t, slot)
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()

	for _, tc := range []struct {
		name   string
		egress netns.Egress
		addr   string
	}{
		{"a subnet of the host", netns.Egress{Internet: true}, "198.18.5.9:80"},
		{"a private network", netns.Egress{Internet: true}, "10.123.45.9:80"},
		{"the host through the slot's address", netns.Egress{Internet: true}, net.JoinHostPort(slot.HostIP.String(), portString(ln))},
		{"the gateway's other ports", netns.Egress{Internet: true}, net.JoinHostPort(netns.GatewayIP.String(), "80")},
		{"the internet with egress off", netns.Egress{}, "203.0.113.9:80"},
		{"a denied network", netns.Egress{Internet: true, Deny: prefixes("203.0.113.0/24")}, "203.0.113.9:80"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := m.SetEgress(ctx, slot, tc.egress); err != nil {
				t.Fatal(err)
			}
			_, err := s.read(tc.addr)
			if !errors.Is(err, syscall.ECONNREFUSED) {
				t.Errorf("tcp to %s: got %v, want connection refused", tc.addr, err)
			}
		})
	}
	t.Run("udp with egress off", func(t *testing.T) {
		if err := m.SetEgress(ctx, slot, netns.Egress{}); err != nil {
			t.Fatal(err)
		}
		var c net.Conn
		if err := s.do(func() (err error) { c, err = net.Dial("udp4", "203.0.113.9:9"); return err }); err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(3 * time.Second))
		c.Write([]byte("x"))
		_, err := c.Read(make([]byte, 16))
		// Linux reports ICMP admin-prohibited as "no route to host".
		if !errors.Is(err, syscall.EHOSTUNREACH) {
			t.Errorf("udp to 203.0.113.9: got %v, want host unreachable", err)
		}
	})
}

// BenchmarkDNSForwarder measures a UDP query from a sandbox through its
// slot's forwarder to a resolver on loopback and back.
func BenchmarkDNSForwarder(b *testing.B) {
	testenv.NeedRoot(b)
	m, err := netns.NewManager(testCIDR, testTag)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := m.InstallFirewall(ctx); err != nil {
		b.Fatalf("InstallFirewall: %v", err)
	}
	b.Cleanup(func() { m.RemoveFirewall(context.Background()) })
	upstream := testenv.FakeDNS(b, map[string]string{"known.test": "198.51.100.7"})
	if err := m.SetResolvers([]string{upstream.Addr}); err != nil {
		b.Fatal(err)
	}
	m.Delete(ctx, m.SlotFor(33))
	slot, err := m.Create(ctx, 33)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Delete(context.Background(), slot) })
	if err := m.Activate(ctx, slot); err != nil {
		b.Fatal(err)
	}
	if err := m.SetEgress(ctx, slot, netns.Egress{Internet: true}); err != nil {
		b.Fatal(err)
	}
	s := standIn(b, slot)
	var c net.Conn
	if err := s.do(func() (err error) {
		c, err = net.Dial("udp4", net.JoinHostPort(netns.GatewayIP.String(), "53"))
		return err
	}); err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	q := query(1, "known.test")
	buf := make([]byte, 512)
	start := cpuTime(b)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write(q); err != nil {
			b.Fatal(err)
		}
		if _, err := c.Read(buf); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(cpuTime(b)-start)/float64(b.N), "cpu-us/op")
}
