package dialer_test

import (
	"context"
	"net"
	"syscall"
	"testing"

	"github.com/agentenv/agentenv/internal/dialer"
)

// TestMarkApplied: every connection runs the mark function first, and its
// failure fails the dial.
func TestMarkApplied(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	calls := 0
	d := dialer.New(func(_, _ string, _ syscall.RawConn) error { calls++; return nil })
	c, err := d.DialContext(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	c.Close()
	if calls != 1 {
		t.Errorf("got %d mark calls, want 1", calls)
	}
	refuse := dialer.New(func(_, _ string, _ syscall.RawConn) error { return syscall.EPERM })
	if _, err := refuse.DialContext(context.Background(), "tcp", ln.Addr().String()); err == nil {
		t.Error("dial with a failing mark: got nil error, want EPERM")
	}
	if _, err := dialer.New(nil).DialContext(context.Background(), "tcp", ln.Addr().String()); err != nil {
		t.Errorf("dial without a mark: %v", err)
	}
}
