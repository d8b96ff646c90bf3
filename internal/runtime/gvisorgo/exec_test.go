package gvisorgo

import (
	"bytes"
	"context"
	goruntime "runtime"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/runtime"
)

// TestExecOutputIsCapped: a sandbox printing 200 MB to an Exec leaves the
// host with the output's tail, and allocates a few buffers, not the output.
func TestExecOutputIsCapped(t *testing.T) {
	e := newEnv(t)
	g := e.newRuntime(t, "root")
	s := e.spec(t, g)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := g.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	var before, after goruntime.MemStats
	goruntime.ReadMemStats(&before)
	code, out, err := g.Exec(ctx, s.ID, []string{"/bin/sh", "-c", "head -c 200000000 /dev/zero; echo; echo END >&2"})
	goruntime.ReadMemStats(&after)
	if err != nil || code != 0 {
		t.Fatalf("exec: code %d, err %v", code, err)
	}
	if len(out) > runtime.ExecOutputMax || !bytes.HasSuffix(out, []byte("\x00\nEND\n")) {
		t.Errorf("got %d bytes ending %q, want at most %d ending with the output's end", len(out), out[max(0, len(out)-8):], runtime.ExecOutputMax)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 32<<20 {
		t.Errorf("exec of 200 MB of output allocated %d MiB on the host, want a few buffers", alloc>>20)
	}
}
