package store

import (
	"log/slog"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/sandbox"
)

func newTestCache() *Cache {
	c := &Cache{seal: testSeal, log: slog.New(slog.DiscardHandler), gone: map[string]chan struct{}{}, deleted: map[string]time.Time{}}
	c.reset()
	return c
}

// A watch that lags (its etcd member went away) must not undo what this
// API server did itself: a killed sandbox's late create event, an old
// cordon event after a newer drain.
func TestCacheKeepsOwnChangesOverLateWatchEvents(t *testing.T) {
	c := newTestCache()
	rec, _ := testSeal.Seal(SandboxPrefix+"i1", RecordOf("n1", sandbox.Sandbox{ID: "i1"}))

	c.PutSandbox(RecordOf("n1", sandbox.Sandbox{ID: "i1"}))
	c.DropSandbox("i1") // killed through this API server
	c.mu.Lock()
	c.apply(SandboxPrefix+"i1", []byte(rec), false, 10) // the create, late
	c.mu.Unlock()
	if _, ok := c.Sandbox("i1"); ok || c.perNode["n1"] != 0 {
		t.Fatalf("a late create event brought killed sandbox i1 back (n1 counts %d)", c.perNode["n1"])
	}

	c.SetCordon("n3", "drain", false, 20) // drained through this API server
	if !c.Cordoned("n3") {
		t.Fatal("drain not seen at once")
	}
	c.mu.Lock()
	c.apply(CordonPrefix+"n3", nil, true, 15) // an older uncordon, late
	c.mu.Unlock()
	if !c.Cordoned("n3") {
		t.Fatal("an older uncordon event undid a newer drain")
	}
	c.mu.Lock()
	c.apply(CordonPrefix+"n3", nil, true, 25) // a newer uncordon
	c.mu.Unlock()
	if c.Cordoned("n3") {
		t.Fatal("a newer uncordon was ignored")
	}
}
