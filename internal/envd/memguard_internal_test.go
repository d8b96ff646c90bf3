package envd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pb "github.com/agentenv/agentenv/client/api/envd/processpb"
)

func TestParseMeminfo(t *testing.T) {
	for _, tc := range []struct {
		name, text   string
		total, avail int64
		ok           bool
	}{
		{"gvisor", "MemTotal:         524288 kB\nMemFree:          521316 kB\nMemAvailable:     521316 kB\nBuffers: 0 kB\n", 512 << 20, 521316 << 10, true},
		{"no newline at end", "MemAvailable: 10 kB\nMemTotal: 20 kB", 20 << 10, 10 << 10, true},
		{"no MemAvailable", "MemTotal: 20 kB\nMemFree: 10 kB\n", 0, 0, false},
		{"garbage number", "MemTotal: 2x0 kB\nMemAvailable: 10 kB\n", 0, 0, false},
		{"empty", "", 0, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			total, avail, ok := parseMeminfo([]byte(tc.text))
			if total != tc.total || avail != tc.avail || ok != tc.ok {
				t.Errorf("got %d, %d, %v; want %d, %d, %v", total, avail, ok, tc.total, tc.avail, tc.ok)
			}
		})
	}
}

// The poll interval is the time the fastest planned allocation needs to
// reach the kill line, within its bounds.
func TestGuardInterval(t *testing.T) {
	const total = 512 << 20
	if got := guardInterval(4<<30, 4<<30); got != guardMaxPoll {
		t.Errorf("idle 4 GiB: got %v, want %v", got, guardMaxPoll)
	}
	if got := guardInterval(total, total); got < 150*time.Millisecond {
		t.Errorf("idle 512 MiB: got %v, want at least 150ms (a few polls a second)", got)
	}
	if got := guardInterval(total, guardHeadroom(total)); got != guardMinPoll {
		t.Errorf("at the kill line: got %v, want %v", got, guardMinPoll)
	}
	if got := guardInterval(total, 0); got != guardMinPoll {
		t.Errorf("full: got %v, want %v", got, guardMinPoll)
	}
	left := int64(100 << 20)
	want := time.Duration(float64(left) / guardRate * float64(time.Second))
	unseen := int64(guardRate * guardLag.Seconds())
	if got := guardInterval(total, guardHeadroom(total)+unseen+left); got != want {
		t.Errorf("100 MiB above the line: got %v, want %v", got, want)
	}
}

func TestOverLine(t *testing.T) {
	const total = 512 << 20
	line := int64(total - guardHeadroom(total))
	for _, tc := range []struct {
		name string
		used int64
		rate float64
		want bool
	}{
		{"idle", 20 << 20, 0, false},
		{"steady just below the line", line - 1, 0, false},
		{"steady at the line", line, 0, true},
		{"freeing at the line", line, -1 << 30, true},
		{"growing fast far below", line - 200<<20, 1.6 * (1 << 30), false},
		{"growing fast, the lag would cross", line - 50<<20, 1.6 * (1 << 30), true},
	} {
		if got := overLine(total, tc.used, tc.rate); got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
	// The headroom covers what the host counts beyond meminfo (measured
	// 14-17 MiB) with a margin, and stays a small part of a large limit.
	if h := guardHeadroom(512 << 20); h < 32<<20 || h > 64<<20 {
		t.Errorf("headroom of 512 MiB: got %d MiB, want 32-64", h>>20)
	}
	if h := guardHeadroom(8 << 30); h > 8<<30/20 {
		t.Errorf("headroom of 8 GiB: got %d MiB, want at most 5%%", h>>20)
	}
}

func TestGrowth(t *testing.T) {
	var g growth
	t0 := time.Unix(1000, 0)
	if r := g.observe(100<<20, t0); r != 0 {
		t.Errorf("first sample: got rate %v, want 0", r)
	}
	// meminfo moves in steps: the rate is between the steps' first sightings.
	g.observe(100<<20, t0.Add(10*time.Millisecond))
	if r := g.observe(200<<20, t0.Add(50*time.Millisecond)); r != float64(100<<20)/0.05 {
		t.Errorf("a 100 MiB step after 50 ms: got %v, want %v", r, float64(100<<20)/0.05)
	}
	// A step after a quiet while counts as grown within guardLag.
	var q growth
	q.observe(0, t0)
	if r, want := q.observe(60<<20, t0.Add(10*time.Second)), float64(60<<20)/guardLag.Seconds(); r != want {
		t.Errorf("a 60 MiB step after 10 s: got %v, want %v", r, want)
	}
	if r := g.observe(200<<20, t0.Add(60*time.Millisecond)); r == 0 {
		t.Error("10 ms into a step: got rate 0, want the last step's")
	}
	if r := g.observe(200<<20, t0.Add(50*time.Millisecond+guardMaxPoll+time.Millisecond)); r != 0 {
		t.Errorf("no step for longer than a poll: got rate %v, want 0", r)
	}
}

// fakeProc writes a proc tree of processes with the given resident pages.
func fakeProc(t *testing.T, procs map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for pid, statm := range procs {
		d := filepath.Join(dir, pid)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(d, "statm"), []byte(statm), 0o644)
		os.WriteFile(filepath.Join(d, "stat"), []byte(pid+" (a b) S 1 "+pid+"\n"), 0o644)
	}
	os.MkdirAll(filepath.Join(dir, "self"), 0o755)
	os.WriteFile(filepath.Join(dir, "meminfo"), []byte("MemTotal: 1 kB\n"), 0o644)
	return dir
}

func TestBiggestSkipsInitAndSelf(t *testing.T) {
	page := int64(os.Getpagesize())
	proc := fakeProc(t, map[string]string{
		"1":  "900000 90000 0 0 0 0 0", // init
		"7":  "900000 80000 0 0 0 0 0", // envd itself
		"12": "5000 3000 0 0 0 0 0",
		"13": "500000 40000 0 0 0 0 0",
		"14": "bad",
	})
	// A child of envd before its exec shows envd's memory.
	os.Symlink("/.agentenv/envd", filepath.Join(proc, "7", "exe"))
	os.MkdirAll(filepath.Join(proc, "15"), 0o755)
	os.WriteFile(filepath.Join(proc, "15", "statm"), []byte("900000 85000 0 0 0 0 0"), 0o644)
	os.Symlink("/.agentenv/envd", filepath.Join(proc, "15", "exe"))
	pid, rss := biggest(proc, 7)
	if pid != 13 || rss != 40000*page {
		t.Errorf("got pid %d with %d bytes, want 13 with %d", pid, rss, 40000*page)
	}
	if pid, _ := biggest(fakeProc(t, map[string]string{"1": "1 1", "7": "1 1"}), 7); pid != 0 {
		t.Errorf("only init and envd: got pid %d, want none", pid)
	}
}

// After a kill the guard waits until meminfo, which lags and may still
// rise, has come down, so that a late count does not cost a second process.
func TestPendingHolds(t *testing.T) {
	t0 := time.Unix(1000, 0)
	p := pending{pid: 20, at: t0, used: 400 << 20}
	if !p.holds(450<<20, t0.Add(10*time.Millisecond)) {
		t.Error("meminfo still rising after the kill: got no hold, want hold")
	}
	if p.holds(20<<20, t0.Add(20*time.Millisecond)) {
		t.Error("meminfo down: got hold, want none")
	}
	if p.holds(450<<20, t0.Add(30*time.Millisecond)) {
		t.Error("another allocation after the memory came back: got hold, want none")
	}
	q := pending{pid: 21, at: t0, used: 400 << 20}
	if q.holds(500<<20, t0.Add(guardExitWait+time.Millisecond)) {
		t.Error("past guardExitWait: got hold, want none")
	}
}

func TestKilledMarksOnce(t *testing.T) {
	var g *MemoryGuard
	if _, ok := g.Killed(5); ok {
		t.Error("no guard: got a kill")
	}
	g = &MemoryGuard{}
	g.mark(OOMKill{PID: 6, Pgid: 5, Comm: "python3", RSS: 400 << 20, Used: 470 << 20, Limit: 512 << 20})
	k, ok := g.Killed(5)
	if !ok || k.PID != 6 {
		t.Fatalf("got %+v, %v; want the kill of pid 6", k, ok)
	}
	if _, ok := g.Killed(5); ok {
		t.Error("second look: got the kill again, want it forgotten")
	}
	for i := 0; i < 2*guardMarksMax; i++ {
		g.mark(OOMKill{Pgid: 1000 + i})
	}
	if n := len(g.killed); n > guardMarksMax {
		t.Errorf("got %d marks kept, want at most %d", n, guardMarksMax)
	}
}

// A guard with envd alone in the sandbox stops polling until a process
// starts.
func TestAlone(t *testing.T) {
	if !alone(fakeProc(t, map[string]string{"1": "1 1", "7": "1 1"}), 7) {
		t.Error("init and envd only: got not alone, want alone")
	}
	if alone(fakeProc(t, map[string]string{"1": "1 1", "7": "1 1", "30": "1 1"}), 7) {
		t.Error("with process 30: got alone, want not alone")
	}
	var g *MemoryGuard
	g.Started() // a nil guard ignores starts
	g = &MemoryGuard{}
	g.Started()
	g.Started() // never blocks
	select {
	case <-g.wake():
	default:
		t.Error("after Started: got no wake, want one")
	}
}

func TestMarkOOM(t *testing.T) {
	k := OOMKill{PID: 6, Pgid: 5, Comm: "python3", RSS: 400 << 20, Used: 470 << 20, Limit: 512 << 20}
	killed := &pb.ProcessEvent_EndEvent{Exited: false, ExitCode: -1, Status: "signal: killed"}
	markOOM(killed, k)
	if killed.ExitCode != 137 || !strings.Contains(killed.GetError(), "out of memory") || !strings.Contains(killed.GetError(), "512 MiB") {
		t.Errorf("command killed by the guard: got exit code %d, error %q; want 137 and an out-of-memory error naming the limit", killed.ExitCode, killed.GetError())
	}
	// A shell that outlived its killed child keeps its own exit code.
	shell := &pb.ProcessEvent_EndEvent{Exited: true, ExitCode: 3, Status: "exit status 3"}
	markOOM(shell, k)
	if shell.ExitCode != 3 || !strings.Contains(shell.GetError(), "out of memory") {
		t.Errorf("shell whose child was killed: got exit code %d, error %q; want 3 and an out-of-memory error", shell.ExitCode, shell.GetError())
	}
}
