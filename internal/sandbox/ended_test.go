package sandbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
)

// A sandbox that is gone says how it went: killed, or timed out (with
// when), rather than a bare "does not exist".
func TestGoneSandboxSaysHow(t *testing.T) {
	m, _ := lifecycleManager(t)
	killed := running(t, m, Lifecycle{}, time.Hour)
	if err := m.Kill(context.Background(), killed.sb.ID); err != nil {
		t.Fatal(err)
	}
	expired := running(t, m, Lifecycle{}, time.Millisecond)
	eventually(t, "sandbox not killed at its timeout", func() bool {
		_, err := m.Get(expired.sb.ID)
		return err != nil
	})
	for _, tc := range []struct {
		id, want, cause string
	}{
		{killed.sb.ID, "it was killed at ", EndKilled},
		{expired.sb.ID, "it timed out at ", EndTimeout},
		{"sb-never", "it may have been killed or timed out", ""},
	} {
		_, err := m.Get(tc.id)
		if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Get(%s): got %v, want not found saying %q", tc.id, err, tc.want)
		}
		if got := EndCause(err); got != tc.cause {
			t.Errorf("EndCause of Get(%s): got %q, want %q", tc.id, got, tc.cause)
		}
	}
}

// The memory of ended sandboxes is bounded: the oldest go first.
func TestEndedIsBounded(t *testing.T) {
	var e ended
	now := time.Now()
	for i := range maxEnded + 10 {
		e.add(fmt.Sprint("sb-", i), EndKilled, now)
	}
	if len(e.byID) != maxEnded || len(e.order) != maxEnded {
		t.Errorf("got %d IDs (%d in order), want %d", len(e.byID), len(e.order), maxEnded)
	}
	if _, _, ok := e.how("sb-0"); ok {
		t.Error("the oldest ended sandbox is still remembered")
	}
	if _, _, ok := e.how(fmt.Sprint("sb-", maxEnded+9)); !ok {
		t.Error("the newest ended sandbox is forgotten")
	}
}
