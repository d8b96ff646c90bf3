package testenv

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
)

// DNS is a resolver a test runs on loopback, standing in for the host's:
// it answers A queries for the names it was given, NXDOMAIN for others.
type DNS struct {
	// Addr is its UDP and TCP address, 127.0.0.1:port.
	Addr string
	// Queries counts the queries it answered.
	Queries atomic.Int64
	names   map[string]netip.Addr
	close   func()
}

// Close stops the server.
func (d *DNS) Close() { d.close() }

// FakeDNS starts a DNS on loopback that resolves names (without the final
// dot, lower case) to their IPv4 addresses; it stops when the test ends.
func FakeDNS(t testing.TB, names map[string]string) *DNS {
	t.Helper()
	d, err := StartDNS(names)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return d
}

// StartDNS is FakeDNS for a server that outlives one test: Close stops it.
func StartDNS(names map[string]string) (*DNS, error) {
	d := &DNS{names: map[string]netip.Addr{}}
	for n, a := range names {
		ip, err := netip.ParseAddr(a)
		if err != nil {
			return nil, err
		}
		d.names[strings.ToLower(n)] = ip
	}
	var pc net.PacketConn
	var ln net.Listener
	for i := 0; ; i++ {
		var err error
		if pc, err = net.ListenPacket("udp4", "127.0.0.1:0"); err != nil {
			return nil, err
		}
		if ln, err = net.Listen("tcp4", pc.LocalAddr().String()); err == nil {
			break
		}
		pc.Close()
		if i == 20 {
			return nil, fmt.Errorf("fake DNS: no port free for both UDP and TCP: %w", err)
		}
	}
	d.close = func() { pc.Close(); ln.Close() }
	d.Addr = pc.LocalAddr().String()
	go func() {
		buf := make([]byte, 65535)
		for {
			n, from, err := pc.ReadFrom(buf)
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if err == nil {
				if ans := d.answer(buf[:n]); ans != nil {
					pc.WriteTo(ans, from)
				}
			}
		}
	}()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var l [2]byte
				for {
					if _, err := io.ReadFull(c, l[:]); err != nil {
						return
					}
					q := make([]byte, binary.BigEndian.Uint16(l[:]))
					if _, err := io.ReadFull(c, q); err != nil {
						return
					}
					ans := d.answer(q)
					if ans == nil {
						return
					}
					c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(ans))), ans...))
				}
			}()
		}
	}()
	return d, nil
}

// answer builds the response to one query, nil for what is not a query.
func (d *DNS) answer(q []byte) []byte {
	if len(q) < 12 || q[2]&0x80 != 0 || binary.BigEndian.Uint16(q[4:6]) != 1 {
		return nil
	}
	var labels []string
	i := 12
	for i < len(q) && q[i] != 0 {
		n := int(q[i])
		if n&0xc0 != 0 || i+1+n > len(q) {
			return nil
		}
		labels = append(labels, string(q[i+1:i+1+n]))
		i += 1 + n
	}
	if i+5 > len(q) {
		return nil
	}
	qtype := binary.BigEndian.Uint16(q[i+1 : i+3])
	end := i + 5
	d.Queries.Add(1)
	out := append([]byte(nil), q[:end]...)
	out[2] = out[2]&0x01 | 0x84 // response, authoritative, RD as asked
	out[3] = 0x80               // recursion available, NOERROR
	clear(out[6:12])
	addr, ok := d.names[strings.ToLower(strings.Join(labels, "."))]
	switch {
	case !ok:
		out[3] |= 3 // NXDOMAIN
	case qtype == 1:
		binary.BigEndian.PutUint16(out[6:8], 1)
		a := addr.As4()
		// The name as a pointer to the question, type A, class IN, TTL 60.
		out = append(out, 0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4)
		out = append(out, a[:]...)
	}
	return out
}
