package lifecycletest

import (
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/runtime"
	"github.com/agentenv/agentenv/internal/sandbox"
)

func TestUnprivilegedCreateKill(t *testing.T) {
	x := newHost(t)
	sb := x.create(sandbox.CreateRequest{})
	if err := health(sb); err != nil {
		t.Fatalf("envd of a new sandbox: %v", err)
	}
	if got := x.fakeState(sb.ID); got != runtime.StatusRunning {
		t.Fatalf("runtime state %s, want running", got)
	}
	if err := x.m.Kill(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	eventually(t, "runtime forgets the killed sandbox", func() bool { return x.fakeState(sb.ID) == runtime.StatusUnknown })
	_ = time.Second
}
