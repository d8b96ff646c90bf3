package server

import (
	"log/slog"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"
)

// HTTPLimits bound what one client can hold of an HTTP server of agentenv
// (the API, the sandbox proxy, a fleet node's port). Zero fields take the
// defaults below.
type HTTPLimits struct {
	// ReadHeaderTimeout bounds reading a request's headers (default 10 s);
	// a new connection that sends nothing is closed after it.
	ReadHeaderTimeout time.Duration
	// IdleTimeout closes a keep-alive connection that sends no next
	// request for this long (default 2 min: longer than the 90 s our own
	// clients keep idle connections, so that they close first and never
	// send on one the server is closing). Without it (Go's zero) an idle
	// connection stays open for ever, holding a descriptor.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's headers (default 64 KiB); larger
	// ones get 431.
	MaxHeaderBytes int
	// MaxConnsPerIP caps the open connections from one source (an IPv4
	// address, or an IPv6 /64); beyond it, new connections from that
	// source are closed at once, other sources unaffected. 0: the default
	// (DefaultMaxConnsPerIP); negative: no cap.
	MaxConnsPerIP int
}

const (
	defaultReadHeaderTimeout = 10 * time.Second
	defaultIdleTimeout       = 2 * time.Minute
	defaultMaxHeaderBytes    = 64 << 10
	// maxConnsPerIPCeiling is the default cap on a host with many
	// descriptors: a client driving the default --max-sandboxes (2000)
	// with a command stream and an API call each fits in it.
	maxConnsPerIPCeiling = 4096
)

// DefaultMaxConnsPerIP is the default cap on one source's connections: a
// quarter of this process's open-file limit (so that one source cannot
// take the descriptors that sandboxes and other clients need), at most
// 4096 and at least 16.
func DefaultMaxConnsPerIP() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur/4 >= maxConnsPerIPCeiling {
		return maxConnsPerIPCeiling
	}
	return max(16, int(rl.Cur/4))
}

func (l HTTPLimits) withDefaults() HTTPLimits {
	if l.ReadHeaderTimeout <= 0 {
		l.ReadHeaderTimeout = defaultReadHeaderTimeout
	}
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = defaultIdleTimeout
	}
	if l.MaxHeaderBytes <= 0 {
		l.MaxHeaderBytes = defaultMaxHeaderBytes
	}
	if l.MaxConnsPerIP == 0 {
		l.MaxConnsPerIP = DefaultMaxConnsPerIP()
	}
	return l
}

// NewHTTPServer is how every agentenv HTTP server is made: with header,
// idle and header-size limits, so that idle or slow clients cannot hold
// connections for ever. Serve it on a listener from LimitConnsPerIP.
func NewHTTPServer(h http.Handler, l HTTPLimits) *http.Server {
	l = l.withDefaults()
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		IdleTimeout:       l.IdleTimeout,
		MaxHeaderBytes:    l.MaxHeaderBytes,
	}
}

// LimitConnsPerIP wraps ln so that one source holds at most l.MaxConnsPerIP
// open connections (see HTTPLimits). A connection over the cap is reset at
// once, before any byte is read; log, if not nil, hears of it at most once
// a minute.
func LimitConnsPerIP(ln net.Listener, l HTTPLimits, log *slog.Logger) net.Listener {
	l = l.withDefaults()
	if l.MaxConnsPerIP < 0 {
		return ln
	}
	return &perSourceListener{Listener: ln, max: l.MaxConnsPerIP, log: log, open: map[string]int{}}
}

type perSourceListener struct {
	net.Listener
	max int
	log *slog.Logger

	mu       sync.Mutex
	open     map[string]int
	refused  int
	lastWarn time.Time
}

func (l *perSourceListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		key := sourceKey(c.RemoteAddr())
		l.mu.Lock()
		if l.open[key] >= l.max {
			l.refused++
			warn := l.log != nil && time.Since(l.lastWarn) >= time.Minute
			refused := l.refused
			if warn {
				l.lastWarn, l.refused = time.Now(), 0
			}
			l.mu.Unlock()
			if tc, ok := c.(*net.TCPConn); ok {
				// A reset: no TIME_WAIT on this side for a refused peer.
				tc.SetLinger(0)
			}
			c.Close()
			if warn {
				l.log.Warn("refusing connections: source over its connection cap (--max-conns-per-ip)",
					"listener", l.Addr().String(), "source", key, "cap", l.max, "refused", refused)
			}
			continue
		}
		l.open[key]++
		l.mu.Unlock()
		return &sourceConn{Conn: c, l: l, key: key}, nil
	}
}

func (l *perSourceListener) done(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[key]--; l.open[key] <= 0 {
		delete(l.open, key)
	}
}

// sourceKey is the source a connection counts against: its IPv4 address,
// or the /64 of an IPv6 one (one host may hold a whole /64).
func sourceKey(a net.Addr) string {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return a.String()
	}
	if ip4 := ta.IP.To4(); ip4 != nil {
		return ip4.String()
	}
	return ta.IP.Mask(net.CIDRMask(64, 128)).String() + "/64"
}

// sourceConn gives its slot back once closed (by the server, a handler
// that hijacked it, or a TLS layer above it).
type sourceConn struct {
	net.Conn
	l    *perSourceListener
	key  string
	once sync.Once
}

func (c *sourceConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.done(c.key) })
	return err
}

// CloseWrite lets the HTTP server half-close after an error answer (a 431,
// say) so that the client reads it before the connection ends.
func (c *sourceConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Close()
}
