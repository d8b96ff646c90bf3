package sandbox

import (
	"errors"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
)

// FuzzCheckCreate feeds arbitrary create requests (as a client can send
// them) to the limit checks and the egress parsing: they never panic,
// refuse only with ErrInvalid, and what they accept is within the limits.
func FuzzCheckCreate(f *testing.F) {
	f.Add("busybox", int64(30), 2, 512, "A", "1", "10.0.0.0/8", "1.2.3.4")
	f.Add("", int64(-1), -1, 0, "", "\x00", "::1", "300.1.1.1/33")
	f.Add("x", int64(1<<62), 1<<30, -5, "A=B", "v", "0.0.0.0/0", "10.0.0.1/32")
	l := DefaultLimits()
	f.Fuzz(func(t *testing.T, tpl string, timeoutNS int64, cpus, mem int, envK, envV, allow, deny string) {
		req := CreateRequest{
			Template: tpl, Timeout: time.Duration(timeoutNS), CPUs: cpus, MemoryMB: mem,
			EnvVars: map[string]string{envK: envV},
			Network: &Network{AllowInternet: true, AllowOut: []string{allow}, DenyOut: []string{deny}},
		}
		err := l.check(&req)
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("check = %v, want ErrInvalid", err)
			}
			return
		}
		if req.Timeout <= 0 || req.Timeout > l.MaxTimeout || req.CPUs < 1 || req.CPUs > l.MaxCPUs || req.MemoryMB < 64 || req.MemoryMB > l.MaxMemMB {
			t.Fatalf("check accepted out-of-range %+v", req)
		}
		e, err := req.Network.egress()
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("egress = %v, want ErrInvalid", err)
			}
			return
		}
		for _, p := range append(e.Allow, e.Deny...) {
			if !p.Addr().Is4() || p != p.Masked() {
				t.Fatalf("egress accepted %v (want masked IPv4 prefixes)", p)
			}
		}
	})
}
