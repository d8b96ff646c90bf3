package netns

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	vnetns "github.com/vishvananda/netns"
)

// Every sandbox's resolver is its gateway, GatewayIP port 53 (the same in
// every slot, so a snapshot resolves wherever it is restored): a forwarder
// of the server listens there inside each slot's namespace and passes
// queries, unparsed, to the host's resolvers. The sandbox cannot choose
// where they go, and nothing outside the namespace can reach the
// forwarder's sockets, so it opens neither the host's other services nor
// an open resolver. It answers while the slot's egress policy lets it
// reach the internet (Egress.Internet); otherwise it refuses at once. A
// slot costs two sockets and two goroutines while it exists, plus one
// goroutine per query in flight.

const dnsPort = 53

// ResolvConf is the /etc/resolv.conf of every sandbox.
func ResolvConf() []byte {
	return []byte("nameserver " + GatewayIP.String() + "\n")
}

const (
	// hostResolvConf names the host's resolvers unless SetResolvers chose.
	hostResolvConf = "/etc/resolv.conf"
	// upstreamTimeout bounds one attempt at one resolver.
	upstreamTimeout = 2 * time.Second
	// tcpTimeout bounds a DNS-over-TCP connection through the forwarder.
	tcpTimeout = 30 * time.Second
	// A slot's queries and TCP connections in flight; more are dropped
	// (the sandbox's resolver retries).
	maxUDPInFlight = 64
	maxTCPConns    = 8
	maxQuery       = 4096
)

// resolvers are the upstreams forwarders send to: a fixed list, or the
// nameservers of the host's resolv.conf, read again when the file changes.
type resolvers struct {
	mu     sync.Mutex
	fixed  []string
	path   string
	stamp  string // modification time and size of path when read
	cached []string
}

// list returns the upstreams as host:port, in order.
func (r *resolvers) list() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fixed != nil {
		return r.fixed
	}
	st, err := os.Stat(r.path)
	stamp := ""
	if err == nil {
		stamp = fmt.Sprint(st.ModTime().UnixNano(), st.Size())
	}
	if r.cached == nil || stamp != r.stamp {
		r.cached, r.stamp = readNameservers(r.path), stamp
	}
	return r.cached
}

// readNameservers reads a resolv.conf's nameservers as host:port; with
// none (or no file), the resolver on the host's loopback, as libc does.
func readNameservers(path string) []string {
	var out []string
	if f, err := os.Open(path); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 2 || fields[0] != "nameserver" {
				continue
			}
			if a, err := netip.ParseAddr(fields[1]); err == nil {
				out = append(out, netip.AddrPortFrom(a, dnsPort).String())
			}
		}
		f.Close()
	}
	if len(out) == 0 {
		out = []string{"127.0.0.1:53"}
	}
	return out
}

// SetResolvers chooses the upstream resolvers of every slot's DNS
// forwarder (IP:port, or a bare IP for port 53), instead of the host's
// /etc/resolv.conf; an empty list goes back to that file.
func (m *Manager) SetResolvers(addrs []string) error {
	var fixed []string
	for _, a := range addrs {
		if ip, err := netip.ParseAddr(a); err == nil {
			fixed = append(fixed, netip.AddrPortFrom(ip, dnsPort).String())
			continue
		}
		ap, err := netip.ParseAddrPort(a)
		if err != nil {
			return fmt.Errorf("DNS resolver %q: want an IP address or IP:port", a)
		}
		fixed = append(fixed, ap.String())
	}
	m.resolvers.mu.Lock()
	m.resolvers.fixed = fixed
	m.resolvers.mu.Unlock()
	return nil
}

// forwarder is one slot's DNS forwarder (see the top of this file).
type forwarder struct {
	udp *net.UDPConn
	tcp *net.TCPListener
	up  *resolvers
	// on: the slot's policy lets its sandbox resolve names; gen changes
	// when the slot's sandbox goes, so that a late answer to it is not
	// sent to the next one.
	on       atomic.Bool
	gen      atomic.Uint64
	inFlight chan struct{}

	mu     sync.Mutex
	conns  map[net.Conn]bool
	closed bool
	wg     sync.WaitGroup
}

// openForwarder opens a forwarder's sockets inside slot's namespace and
// starts serving; it answers nothing until turned on.
func openForwarder(slot Slot, up *resolvers) (*forwarder, error) {
	f := &forwarder{up: up, inFlight: make(chan struct{}, maxUDPInFlight), conns: map[net.Conn]bool{}}
	err := inNamespace(slot.Path(), func() error {
		// Bound to every address: the gateway's is added only when the
		// sandbox has started (Activate); the namespace's input chain lets
		// in only what the sandbox sends to the gateway.
		var err error
		if f.udp, err = net.ListenUDP("udp4", &net.UDPAddr{Port: dnsPort}); err != nil {
			return err
		}
		f.tcp, err = net.ListenTCP("tcp4", &net.TCPAddr{Port: dnsPort})
		return err
	})
	if err != nil {
		if f.udp != nil {
			f.udp.Close()
		}
		return nil, fmt.Errorf("open the DNS forwarder of slot %d: %w", slot.Index, err)
	}
	f.wg.Add(2)
	go f.serveUDP()
	go f.serveTCP()
	return f, nil
}

// set turns answering on or off; off also forgets the queries in flight.
func (f *forwarder) set(on bool) {
	if !on {
		f.gen.Add(1)
	}
	f.on.Store(on)
}

func (f *forwarder) close() {
	f.mu.Lock()
	f.closed = true
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.udp.Close()
	f.tcp.Close()
	f.wg.Wait()
}

func (f *forwarder) serveUDP() {
	defer f.wg.Done()
	// Queries are small (a question and EDNS options): a buffer this size
	// per slot, not 64 KiB; a longer datagram is dropped.
	buf := make([]byte, maxQuery)
	for {
		n, from, err := f.udp.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		if n < dnsHeaderLen || n == len(buf) || buf[2]&0x80 != 0 || from.Addr() != internalAddr {
			continue
		}
		if !f.on.Load() {
			f.udp.WriteToUDPAddrPort(dnsError(buf[:n], rcodeRefused), from)
			continue
		}
		select {
		case f.inFlight <- struct{}{}:
		default:
			continue
		}
		query := bytes.Clone(buf[:n])
		gen := f.gen.Load()
		f.wg.Add(1)
		go func() {
			defer func() { <-f.inFlight; f.wg.Done() }()
			answer := f.exchange(query)
			if f.on.Load() && f.gen.Load() == gen {
				f.udp.WriteToUDPAddrPort(answer, from)
			}
		}()
	}
}

// exchange asks the upstreams in turn; when none answers, the sandbox gets
// a server failure at once rather than waiting for its own timeout.
func (f *forwarder) exchange(query []byte) []byte {
	buf := make([]byte, 65535)
	for _, addr := range f.up.list() {
		if answer, ok := f.ask(addr, query, buf); ok {
			return answer
		}
	}
	return dnsError(query, rcodeServFail)
}

// ask sends query to one upstream and waits upstreamTimeout at most for
// its answer (or until the forwarder closes).
func (f *forwarder) ask(addr string, query, buf []byte) ([]byte, bool) {
	c, err := net.DialTimeout("udp", addr, upstreamTimeout)
	if err != nil {
		return nil, false
	}
	defer c.Close()
	if !f.track(c, true) {
		return nil, false
	}
	defer f.track(c, false)
	c.SetDeadline(time.Now().Add(upstreamTimeout))
	if _, err := c.Write(query); err != nil {
		return nil, false
	}
	for {
		n, err := c.Read(buf)
		if err != nil {
			return nil, false
		}
		// The answer to this query: same ID, the response bit set.
		if n >= dnsHeaderLen && buf[0] == query[0] && buf[1] == query[1] && buf[2]&0x80 != 0 {
			return bytes.Clone(buf[:n]), true
		}
	}
}

func (f *forwarder) serveTCP() {
	defer f.wg.Done()
	slots := make(chan struct{}, maxTCPConns)
	for {
		c, err := f.tcp.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		if !f.on.Load() {
			c.Close()
			continue
		}
		select {
		case slots <- struct{}{}:
		default:
			c.Close()
			continue
		}
		if !f.track(c, true) {
			c.Close()
			return
		}
		f.wg.Add(1)
		go func() {
			defer func() { f.track(c, false); c.Close(); <-slots; f.wg.Done() }()
			f.relayTCP(c)
		}()
	}
}

// track records an open connection (or forgets it), for close to end it;
// false once closed.
func (f *forwarder) track(c net.Conn, add bool) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !add {
		delete(f.conns, c)
		return true
	}
	if f.closed {
		return false
	}
	f.conns[c] = true
	return true
}

// relayTCP passes a DNS-over-TCP connection to the first upstream that
// takes it, bytes unchanged both ways, for at most tcpTimeout.
func (f *forwarder) relayTCP(c net.Conn) {
	var up net.Conn
	for _, addr := range f.up.list() {
		var err error
		if up, err = net.DialTimeout("tcp", addr, upstreamTimeout); err == nil {
			break
		}
	}
	if up == nil {
		return
	}
	defer up.Close()
	if !f.track(up, true) {
		return
	}
	defer f.track(up, false)
	deadline := time.Now().Add(tcpTimeout)
	c.SetDeadline(deadline)
	up.SetDeadline(deadline)
	done := make(chan struct{})
	go func() {
		io.Copy(up, c)
		up.(*net.TCPConn).CloseWrite()
		close(done)
	}()
	io.Copy(c, up)
	c.Close()
	<-done
}

var internalAddr = netip.AddrFrom4([4]byte(InternalIP.To4()))

const (
	dnsHeaderLen  = 12
	rcodeServFail = 2
	rcodeRefused  = 5
)

// dnsError answers query with rcode: its header as a response, with its
// question and nothing else (a query whose question cannot be read gets
// the header alone).
func dnsError(query []byte, rcode byte) []byte {
	end := dnsHeaderLen
	qd := binary.BigEndian.Uint16(query[4:6])
	if qd > 0 {
		// The first question: labels up to the root, type and class.
		i := dnsHeaderLen
		for i < len(query) && query[i] != 0 && query[i]&0xc0 == 0 {
			i += 1 + int(query[i])
		}
		if i+5 <= len(query) && query[i] == 0 {
			end = i + 5
		}
	}
	out := bytes.Clone(query[:end])
	out[2] = out[2]&0x79 | 0x80 // response; keep opcode and RD; not AA, not TC
	out[3] = rcode              // no RA, no flags
	if end > dnsHeaderLen {
		binary.BigEndian.PutUint16(out[4:6], 1)
	} else {
		binary.BigEndian.PutUint16(out[4:6], 0)
	}
	clear(out[6:12]) // no answers, authorities or additionals
	return out
}

// inNamespace runs fn on a thread inside the network namespace at path:
// sockets it opens belong to that namespace.
func inNamespace(path string, fn func() error) error {
	ns, err := vnetns.GetFromPath(path)
	if err != nil {
		return err
	}
	defer ns.Close()
	runtime.LockOSThread()
	orig, err := vnetns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	if err := vnetns.Set(ns); err != nil {
		runtime.UnlockOSThread()
		return err
	}
	err = fn()
	if serr := vnetns.Set(orig); serr != nil {
		// The thread is stuck in the namespace: keep it locked so the Go
		// runtime discards it when this goroutine ends.
		return errors.Join(err, serr)
	}
	runtime.UnlockOSThread()
	return err
}

// forwarderOf returns the slot's DNS forwarder, opening it if the slot has
// none yet (a slot this server did not create: adopted after a restart).
func (m *Manager) forwarderOf(slot Slot) (*forwarder, error) {
	m.dnsMu.Lock()
	defer m.dnsMu.Unlock()
	if f := m.dns[slot.Index]; f != nil {
		return f, nil
	}
	f, err := openForwarder(slot, m.resolvers)
	if err != nil {
		return nil, err
	}
	if m.dns == nil {
		m.dns = map[int]*forwarder{}
	}
	m.dns[slot.Index] = f
	return f, nil
}

// setDNS turns a slot's forwarder on or off (opening it if needed).
func (m *Manager) setDNS(slot Slot, on bool) error {
	f, err := m.forwarderOf(slot)
	if err != nil {
		return err
	}
	f.set(on)
	return nil
}

// stopDNS turns a slot's forwarder off, if it has one.
func (m *Manager) stopDNS(slot Slot) {
	m.dnsMu.Lock()
	f := m.dns[slot.Index]
	m.dnsMu.Unlock()
	if f != nil {
		f.set(false)
	}
}

// closeDNS closes a slot's forwarder: its sockets would keep the namespace
// alive.
func (m *Manager) closeDNS(slot Slot) {
	m.dnsMu.Lock()
	f := m.dns[slot.Index]
	delete(m.dns, slot.Index)
	m.dnsMu.Unlock()
	if f != nil {
		f.close()
	}
}
