package server_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentenv/agentenv/client"
)

// loadInFlight is how many create → exec → kill cycles run at once.
const loadInFlight = 16

// TestLoad runs create → exec → kill cycles, 16 at a time, through the Go
// client for AGENTENV_SOAK_DURATION (2m by default; `make soak
// DURATION=30m`), with a fork into two children (each runs a command)
// every 20th cycle and a snapshot, then its deletion, every 10th. Every
// request must succeed; afterwards nothing of any sandbox it made may be
// left on the host: processes, mounts, cgroups, runsc state, directories,
// network namespaces and veths beyond the server's pools.
func TestLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("load test: runs for minutes")
	}
	dur := 2 * time.Minute
	if v := os.Getenv("AGENTENV_SOAK_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("AGENTENV_SOAK_DURATION=%q: want a duration such as 30m", v)
		}
		dur = d
	}
	e := sharedServer(t)
	ctx := context.Background()
	// The server's pools (slots, warm containers, hot sandboxes) are filled
	// before and refilled after; wait until they have settled.
	time.Sleep(2 * time.Second)
	netBefore := netState(e)
	t.Logf("before: %s", netBefore)

	l := newLoadStats()
	var (
		cycles  atomic.Int64
		idsMu   sync.Mutex
		ids     []string
		started = time.Now()
		until   = started.Add(dur)
	)
	made := func(id string) {
		idsMu.Lock()
		ids = append(ids, id)
		idsMu.Unlock()
	}
	var wg sync.WaitGroup
	for range loadInFlight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(until) {
				n := cycles.Add(1)
				l.cycle(ctx, e, n, made)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(started)

	t.Logf("%d cycles in %v at %d in flight: %.1f cycles/s", cycles.Load(), elapsed.Round(time.Second), loadInFlight, float64(cycles.Load())/elapsed.Seconds())
	for _, line := range l.table() {
		t.Log(line)
	}
	for _, f := range l.failureReport() {
		t.Error(f)
	}

	// Kills answer before their teardown ends: give the teardowns a moment.
	var left []string
	deadline := time.Now().Add(60 * time.Second)
	for {
		left = leaked(e, ids)
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(left) > 0 {
		if len(left) > 20 {
			left = append(left[:20], fmt.Sprintf("… and %d more", len(left)-20))
		}
		t.Errorf("of the %d sandboxes the load made, left on the host: %v", len(ids), left)
	}
	// Network: what is left must be the pools' (slots, warm containers,
	// hot sandboxes) and any live sandbox's, one veth per namespace.
	var after netCount
	for {
		after = netState(e)
		if after.ok(e, t) || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !after.ok(e, t) {
		t.Errorf("network after the load: %s (before: %s); want at most %d slots beyond live, pooled and warm sandboxes, one veth each", after, netBefore, testSlotPool)
	}
}

// loadStats collects latencies and failures per operation.
type loadStats struct {
	mu    sync.Mutex
	lat   map[string][]time.Duration
	fails map[string][]string
}

func newLoadStats() *loadStats {
	return &loadStats{lat: map[string][]time.Duration{}, fails: map[string][]string{}}
}

// do times f as op; a failure is recorded, never retried.
func (l *loadStats) do(op string, f func() error) bool {
	start := time.Now()
	err := f()
	d := time.Since(start)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.fails[op] = append(l.fails[op], err.Error())
		return false
	}
	l.lat[op] = append(l.lat[op], d)
	return true
}

// cycle is one create → exec → (fork | snapshot) → kill.
func (l *loadStats) cycle(ctx context.Context, e *env, n int64, made func(string)) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var sb client.Sandbox
	if !l.do("create", func() (err error) {
		sb, err = e.client.CreateSandbox(ctx, client.CreateRequest{TemplateID: "busybox", Metadata: map[string]string{"test": "load"}})
		return err
	}) {
		return
	}
	made(sb.SandboxID)
	defer l.do("kill", func() error { return e.client.KillSandbox(ctx, sb.SandboxID) })
	l.do("exec", func() error { return echo(ctx, e, sb, n) })

	if n%20 == 0 {
		var kids []client.Sandbox
		l.do("fork(2)", func() error {
			sbs, errs, err := e.client.ForkSandbox(ctx, sb.SandboxID, 2)
			if err != nil {
				return err
			}
			for i, c := range sbs {
				if errs[i] != nil {
					err = fmt.Errorf("child %d: %w", i, errs[i])
					continue
				}
				made(c.SandboxID)
				kids = append(kids, c)
			}
			return err
		})
		for _, c := range kids {
			l.do("exec", func() error { return echo(ctx, e, c, n) })
			l.do("kill", func() error { return e.client.KillSandbox(ctx, c.SandboxID) })
		}
	}
	if n%10 == 0 {
		var snap client.Snapshot
		if l.do("snapshot", func() (err error) {
			snap, err = e.client.SnapshotSandbox(ctx, sb.SandboxID, "", nil)
			return err
		}) {
			l.do("delete snapshot", func() error { return e.client.DeleteSnapshot(ctx, snap.SnapshotID) })
		}
	}
}

// echo runs `echo n` in sb and checks what comes back.
func echo(ctx context.Context, e *env, sb client.Sandbox, n int64) error {
	res, err := e.client.Exec(ctx, sb, "/bin/sh", []string{"-c", fmt.Sprintf("echo %d", n)}, nil, nil)
	if err != nil {
		return err
	}
	if got, want := string(res.Stdout), fmt.Sprintf("%d\n", n); got != want || res.ExitCode != 0 {
		return fmt.Errorf("sandbox %s: got stdout %q exit %d, want %q exit 0", sb.SandboxID, got, res.ExitCode, want)
	}
	return nil
}

// table reports count, p50 and p95 per operation.
func (l *loadStats) table() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	ops := make([]string, 0, len(l.lat))
	for op := range l.lat {
		ops = append(ops, op)
	}
	for op := range l.fails {
		if _, ok := l.lat[op]; !ok {
			ops = append(ops, op)
		}
	}
	sort.Strings(ops)
	out := []string{fmt.Sprintf("%-16s %7s %7s %10s %10s", "op", "ok", "failed", "p50", "p95")}
	for _, op := range ops {
		d := slices.Clone(l.lat[op])
		slices.Sort(d)
		out = append(out, fmt.Sprintf("%-16s %7d %7d %10v %10v", op, len(d), len(l.fails[op]), pct(d, 50), pct(d, 95)))
	}
	return out
}

func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[(len(d)-1)*p/100].Round(100 * time.Microsecond)
}

// failureReport says, per operation, how many requests failed and with
// which distinct errors (sandbox IDs blanked so that alike errors group).
func (l *loadStats) failureReport() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for op, errs := range l.fails {
		seen := map[string]int{}
		for _, err := range errs {
			seen[blankIDs(err)]++
		}
		var lines []string
		for msg, n := range seen {
			lines = append(lines, fmt.Sprintf("  %d× %s", n, msg))
		}
		sort.Strings(lines)
		out = append(out, fmt.Sprintf("%s: %d failed requests:\n%s", op, len(errs), strings.Join(lines, "\n")))
	}
	sort.Strings(out)
	return out
}

// blankIDs replaces sandbox IDs (i + 20 hex digits) with "i…".
func blankIDs(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if isIDAt(s, i) {
			b.WriteString("i…")
			i += 20
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// idsIn returns the sandbox IDs that occur in s.
func idsIn(s string) []string {
	var out []string
	for i := 0; i < len(s); i++ {
		if isIDAt(s, i) {
			out = append(out, s[i:i+21])
			i += 20
		}
	}
	return out
}

func isIDAt(s string, i int) bool {
	return s[i] == 'i' && i+21 <= len(s) && isHex(s[i+1:i+21])
}

func isHex(s string) bool {
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// leaked lists what of the given sandboxes is still on the host, read once
// for all of them: runsc state, processes naming them, cgroups, mounts,
// sandbox directories.
func leaked(e *env, ids []string) []string {
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	var out []string
	if b, err := exec.Command("runsc", "--root", filepath.Join(e.dataDir, "runsc"), "list", "--quiet").Output(); err == nil {
		for _, id := range strings.Fields(string(b)) {
			if want[id] {
				out = append(out, "runsc container "+id)
			}
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		for _, id := range idsIn(string(b)) {
			if want[id] {
				out = append(out, fmt.Sprintf("process %s (%s)", filepath.Base(filepath.Dir(p)), id))
			}
		}
	}
	cgs, _ := filepath.Glob("/sys/fs/cgroup/*/agentenv/i*")
	cgs2, _ := filepath.Glob("/sys/fs/cgroup/agentenv/i*")
	for _, c := range append(cgs, cgs2...) {
		if want[filepath.Base(c)] {
			out = append(out, "cgroup "+c)
		}
	}
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, id := range idsIn(string(b)) {
			if want[id] {
				out = append(out, "mount naming "+id)
			}
		}
	}
	for id := range want {
		if _, err := os.Stat(filepath.Join(e.dataDir, "sandboxes", id)); err == nil {
			out = append(out, "sandbox directory "+id)
		}
	}
	sort.Strings(out)
	return out
}

// netCount is the shared server's network slots on the host.
type netCount struct{ namespaces, veths int }

func (n netCount) String() string {
	return fmt.Sprintf("%d network namespaces, %d host veths", n.namespaces, n.veths)
}

func netState(e *env) netCount {
	n := netCount{namespaces: len(namespaces("tst"))}
	links, _ := exec.Command("ip", "-br", "link").Output()
	for _, l := range strings.Split(string(links), "\n") {
		if strings.HasPrefix(l, "aetst-") {
			n.veths++
		}
	}
	return n
}

// ok says whether the slots are those of the pools (ready slots, hot
// sandboxes: 2, warm containers: as many as there are) and of live
// sandboxes, each with its host veth.
func (n netCount) ok(e *env, t *testing.T) bool {
	live, err := e.client.ListSandboxes(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return n.namespaces <= testSlotPool+e.pooledSandboxes()+e.warmContainers()+len(live) && n.veths == n.namespaces
}
