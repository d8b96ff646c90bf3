// Package lifecycletest is the unprivileged test tier: the
// sandbox lifecycle (timeouts, pause/resume/kill races, recovery after a
// crash, the proxy's route changes) tested through the real server, API,
// manager and proxy on the fake runtime (internal/runtime/fake) and no
// network (`--network none`), as a normal user, in seconds. Root tests
// stay for isolation and the real runtime.
//
// This file holds what the tier's tests (and other packages' tests) need
// to start such a server: Config and a fake Clock. Nothing in production
// may import it.
package lifecycletest

import (
	"fmt"
	"net"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/agentenv/agentenv/internal/envdapi"
	"github.com/agentenv/agentenv/internal/netns"
	"github.com/agentenv/agentenv/internal/runtime"
	"github.com/agentenv/agentenv/internal/runtime/fake"
	"github.com/agentenv/agentenv/internal/sandbox"
	"github.com/agentenv/agentenv/internal/server"
)

// Config returns a server configuration that needs no root: the fake
// runtime running envdPath on the host, sandboxes at loopback addresses
// of cidr (inside 127.0.0.0/8), no hot or warm pool, no ready templates
// (the fake runtime cannot checkpoint). The caller sets Log, the listen
// addresses and Clock as it needs.
func Config(dataDir, envdPath, cidr string) server.Config {
	limits := sandbox.DefaultLimits()
	limits.HotPool = 0
	return server.Config{
		DataDir: dataDir, Envd: envdPath, Network: "none", NetworkCIDR: cidr,
		NewRuntime: NewRuntime, Limits: limits, APIKey: "e2b_lifecycletest",
		Listen: "127.0.0.1:0", ProxyListen: "127.0.0.1:0",
	}
}

// NewRuntime is the fake runtime for server.Config.NewRuntime: each
// sandbox is cfg.Envd on the host, serving at its slot's loopback address,
// as the current user, in its own directory (its working directory and
// the tree a pause without memory saves).
func NewRuntime(cfg server.Config, nets *netns.Manager) (runtime.Runtime, error) {
	me, err := user.Current()
	if err != nil {
		return nil, err
	}
	return fake.New(fake.Config{Root: filepath.Join(cfg.DataDir, "fake"), Command: func(s runtime.Spec) ([]string, error) {
		slot, ok := nets.SlotOf(s.NetNS)
		if !ok {
			return nil, fmt.Errorf("no loopback slot for network %q", s.NetNS)
		}
		wd := fake.WorkDir(s)
		// The template's flags first: the last of a repeated flag wins.
		args := append([]string{cfg.Envd}, s.Args[1:]...)
		return append(args, "-listen", net.JoinHostPort(slot.SandboxIP.String(), strconv.Itoa(envdapi.Port)),
			"-user", me.Username, "-workdir", wd, "-changes-root", wd), nil
	}})
}

// Clock is a fake sandbox.Clock: time moves only by Advance, which runs
// the timers that are due, each on its own goroutine as time.AfterFunc
// does.
type Clock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*timer
}

var _ sandbox.Clock = (*Clock)(nil)

type timer struct {
	c    *Clock
	at   time.Time
	f    func()
	done bool
}

// NewClock returns a fake clock at start.
func NewClock(start time.Time) *Clock { return &Clock{now: start} }

// Now implements sandbox.Clock.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc implements sandbox.Clock. A timer already due runs at once.
func (c *Clock) AfterFunc(d time.Duration, f func()) sandbox.Timer {
	c.mu.Lock()
	t := &timer{c: c, at: c.now.Add(d), f: f}
	if d <= 0 {
		t.done = true
		c.mu.Unlock()
		go f()
		return t
	}
	c.timers = append(c.timers, t)
	c.mu.Unlock()
	return t
}

// Stop implements sandbox.Timer.
func (t *timer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	if t.done {
		return false
	}
	t.done = true
	t.c.timers = slices.DeleteFunc(t.c.timers, func(o *timer) bool { return o == t })
	return true
}

// Advance moves the clock by d and starts the timers due by then.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []*timer
	c.timers = slices.DeleteFunc(c.timers, func(t *timer) bool {
		if t.at.After(c.now) {
			return false
		}
		t.done = true
		due = append(due, t)
		return true
	})
	c.mu.Unlock()
	for _, t := range due {
		go t.f()
	}
}

// Pending is the number of timers not yet due or stopped.
func (c *Clock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}
