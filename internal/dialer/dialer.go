// Package dialer opens the server's connections to sandboxes. The host
// firewall (internal/netns) refuses connections to sandbox addresses that
// lack the server's socket mark, so every such connection — envd calls,
// proxied traffic — comes from one Dialer that sets it.
//
// It owns the dial settings (timeouts, keep-alive) and applying the mark;
// it must not know which mark or which addresses (netns owns the firewall
// and the mark's value), nor anything of sandboxes.
package dialer

import (
	"context"
	"net"
	"syscall"
	"time"
)

// MarkFunc sets the server's mark on a socket before it connects
// (netns.Manager.MarkSocket).
type MarkFunc func(network, address string, c syscall.RawConn) error

// Dialer connects to sandboxes. It is safe for concurrent use.
type Dialer struct {
	nd net.Dialer
}

// Timeout bounds one connection attempt.
const Timeout = 5 * time.Second

// New returns a dialer that marks its sockets with mark (nil: no mark, for
// tests and hosts without the firewall).
func New(mark MarkFunc) *Dialer {
	return &Dialer{nd: net.Dialer{Timeout: Timeout, KeepAlive: 30 * time.Second, Control: mark}}
}

// DialContext connects to addr on network (as net.Dialer.DialContext).
func (d *Dialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return d.nd.DialContext(ctx, network, addr)
}
