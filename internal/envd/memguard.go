package envd

import (
	"bytes"
	"context"
	"fmt"
	"log"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	pb "github.com/agentenv/agentenv/client/api/envd/processpb"
)

// gVisor has no OOM killer: when a sandbox's processes pass its memory
// limit, the host's memory cgroup kills the sentry, and with it envd, every
// process and every file of the sandbox. The memory guard is the OOM killer
// a VM's kernel would have: it watches the sentry's own accounting
// (/proc/meminfo, whose MemTotal is the sandbox's limit, restores with other
// limits included) and, before usage reaches the host's limit, kills the
// process holding the most memory, as Linux does. The host cgroup stays the
// last line, for memory no process holds (files in /dev/shm or on a memory
// overlay).
//
// gVisor's /proc/meminfo lags the host's count while memory grows fast: the
// sentry learns which pages the host committed by scanning, at most every
// 10 ms and less often after a slow scan. So the guard kills early in
// proportion to the growth it sees: at used + rate × guardLag ≥ the line.
//
// Sizes, measured on gVisor systrap (2 cores): a process touching the pages
// of a 1.5 GiB buffer fills a 512 MiB sandbox at ~1.6 GiB/s, and meminfo's
// count moves in steps ~60 ms (~90 MiB) apart; the host cgroup counts 14 MiB
// (idle) to 17 MiB (300 MiB in use) more than the sentry shows inside; a
// guard that waited for meminfo to show 466 MiB missed the host's limit.
const (
	// guardRate is the fastest allocation the guard plans its polls for:
	// above the measured rate, so that the next poll comes before memory
	// can pass the kill line.
	guardRate = 2 << 30 // bytes per second
	// guardLag is how far behind the host the guard may see memory: the
	// sentry's scan interval, a poll and the kill's own latency.
	guardLag = 60 * time.Millisecond
	// guardMinPoll and guardMaxPoll bound the poll interval. Between them
	// the interval is the time guardRate needs to fill what is left below
	// the kill line and the lag: a 512 MiB sandbox whose processes idle
	// polls ~6 times a second, one near its limit every 5 ms, and one
	// with envd alone in it not at all.
	guardMinPoll = 5 * time.Millisecond
	guardMaxPoll = 250 * time.Millisecond
	// guardIdlePoll is the interval while memory is over the line and no
	// process holds enough of it to be worth killing (files fill it).
	guardIdlePoll = 100 * time.Millisecond
	// guardFastGrowth is the growth above which the guard polls every
	// 2 × guardMinPoll, to see the steps of a fast allocation early;
	// idle sandboxes' counts move by pages, far below it.
	guardFastGrowth = 256 << 20 // bytes per second
	// guardMinVictim is the least memory a process must hold to be
	// killed: killing a small process when files fill the memory saves
	// nothing.
	guardMinVictim = 8 << 20
	// guardExitWait bounds how long a killed process may take to free its
	// memory before the guard picks another one.
	guardExitWait = 2 * time.Second
)

// guardHeadroom is how far below total the kill line is: the sentry's own
// memory that the host counts and /proc/meminfo does not (16 MiB plus 1/64
// of the limit, twice the measured slope), and what guardRate allocates in
// one shortest poll plus the kill's latency (2 × guardMinPoll).
func guardHeadroom(total int64) int64 {
	return 16<<20 + total/64 + int64(guardRate)*int64(2*guardMinPoll)/int64(time.Second)
}

// guardInterval is the wait before the next poll when avail bytes of total
// are free: the time guardRate needs to use what is left above the
// headroom and above what it may have allocated unseen (guardLag), within
// [guardMinPoll, guardMaxPoll].
func guardInterval(total, avail int64) time.Duration {
	left := avail - guardHeadroom(total) - int64(guardRate*guardLag.Seconds())
	d := time.Duration(float64(left) / guardRate * float64(time.Second))
	return min(max(d, guardMinPoll), guardMaxPoll)
}

// overLine reports whether used bytes of total, growing at rate bytes per
// second, will have passed the kill line by the time the guard could see
// it.
func overLine(total, used int64, rate float64) bool {
	ahead := used + int64(max(rate, 0)*guardLag.Seconds())
	return ahead >= total-guardHeadroom(total)
}

// growth tracks how fast memory grows, from the times meminfo's count
// changed (it moves in steps, one per sentry scan).
type growth struct {
	last  int64
	at    time.Time
	rate  float64 // bytes per second between the last two steps
	valid bool
}

func (g *growth) observe(used int64, now time.Time) float64 {
	switch {
	case !g.valid:
		g.last, g.at, g.valid = used, now, true
	case used != g.last:
		// A step holds what grew since the sentry's last scan, at most
		// guardLag ago: a step after a quiet while is not slow growth.
		if dt := min(now.Sub(g.at), guardLag).Seconds(); dt > 0 {
			g.rate = float64(used-g.last) / dt
		}
		g.last, g.at = used, now
	case now.Sub(g.at) > guardMaxPoll:
		g.rate = 0 // no step for a while: not growing
	}
	return g.rate
}

// OOMKill is what the guard killed.
type OOMKill struct {
	PID, Pgid   int
	Comm        string
	RSS         int64 // bytes the process held
	Used, Limit int64 // the sandbox's memory when it acted
}

// Message says what happened, for a command's result.
func (k OOMKill) Message() string {
	return fmt.Sprintf("out of memory: the sandbox used %d MiB of its %d MiB limit, so process %d (%s, %d MiB) was killed; use less memory or give the sandbox more (memoryMB at create)",
		k.Used>>20, k.Limit>>20, k.PID, k.Comm, k.RSS>>20)
}

// MemoryGuard kills the biggest process of the sandbox before its memory
// passes the host's limit. Run starts it; Killed tells a command's waiter
// whether its process group lost a process to it.
type MemoryGuard struct {
	// Proc is the proc filesystem's root ("/proc").
	Proc string
	// Self is envd's own PID, never killed.
	Self int
	Log  *log.Logger

	mu     sync.Mutex
	killed map[int]OOMKill // by process group

	wakeOnce sync.Once
	wakeCh   chan struct{}
}

// Started tells the guard that envd started a process. A guard with no
// process to watch (envd alone in the sandbox) does not poll: it waits
// for this.
func (g *MemoryGuard) Started() {
	if g == nil {
		return
	}
	select {
	case g.wake() <- struct{}{}:
	default:
	}
}

func (g *MemoryGuard) wake() chan struct{} {
	g.wakeOnce.Do(func() { g.wakeCh = make(chan struct{}, 1) })
	return g.wakeCh
}

// guardMarksMax bounds the marks of groups that no command collects
// (processes envd did not start).
const guardMarksMax = 256

// Killed returns and forgets the guard's kill in process group pgid.
func (g *MemoryGuard) Killed(pgid int) (OOMKill, bool) {
	if g == nil {
		return OOMKill{}, false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	k, ok := g.killed[pgid]
	delete(g.killed, pgid)
	return k, ok
}

func (g *MemoryGuard) mark(k OOMKill) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.killed == nil {
		g.killed = map[int]OOMKill{}
	}
	if len(g.killed) >= guardMarksMax {
		for pg := range g.killed {
			delete(g.killed, pg)
			break
		}
	}
	g.killed[k.Pgid] = k
}

// Run polls the sandbox's memory until ctx ends. It reads one file per
// poll, through one descriptor kept open (gVisor generates its text anew
// on each read from offset 0).
func (g *MemoryGuard) Run(ctx context.Context) error {
	f, err := os.Open(g.Proc + "/meminfo")
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, 4096)
	t := time.NewTimer(0)
	defer t.Stop()
	var grow growth
	var last pending // the last kill, until its memory is back
	wake := g.wake()
	polls := 0
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		case <-wake:
			// A process started: poll now (the timer may be stopped).
			t.Stop()
			select {
			case <-t.C:
			default:
			}
		}
		// Each poll costs the sentry ~1 ms of CPU; an idle pool of
		// sandboxes with envd alone in them must not pay it.
		if polls++; polls%guardAloneEvery == 1 && alone(g.Proc, g.Self) {
			polls = 0
			grow = growth{}
			continue // until Started
		}
		n, err := unix.Pread(int(f.Fd()), buf, 0)
		if err != nil {
			return fmt.Errorf("read meminfo: %w", err)
		}
		total, avail, ok := parseMeminfo(buf[:n])
		if !ok {
			return fmt.Errorf("meminfo has no MemTotal or MemAvailable")
		}
		now := time.Now()
		used := total - avail
		rate := grow.observe(used, now)
		wait := guardInterval(total, avail)
		if rate > guardFastGrowth {
			wait = min(wait, 2*guardMinPoll)
		}
		held := last.holds(used, now)
		if overLine(total, used, rate) && !held {
			if k, ok := g.kill(total, used); ok {
				last = pending{pid: k.PID, at: now, used: used}
				grow = growth{}
				wait = guardMinPoll
			} else {
				wait = guardIdlePoll
			}
		}
		t.Reset(wait)
	}
}

// pending is a kill whose memory may not be back yet.
type pending struct {
	pid  int
	at   time.Time
	used int64 // meminfo's count when the guard killed
}

// holds reports whether the guard must wait before it kills again: until
// meminfo, which lags and may still rise after the kill, comes down below
// its count at the kill; at most guardExitWait. (PIDs are no help: gVisor
// hands a killed process's PID to the next one.)
func (p *pending) holds(used int64, now time.Time) bool {
	if p.pid == 0 || now.Sub(p.at) > guardExitWait || used < p.used {
		p.pid = 0 // what grows from here is another process's
		return false
	}
	return true
}

// kill kills the process holding the most memory, if one holds enough.
func (g *MemoryGuard) kill(limit, used int64) (OOMKill, bool) {
	pid, rss := biggest(g.Proc, g.Self)
	if pid == 0 || rss < guardMinVictim {
		return OOMKill{}, false
	}
	k := OOMKill{PID: pid, Pgid: pid, Comm: readComm(g.Proc, pid), RSS: rss, Used: used, Limit: limit}
	if pg, err := syscall.Getpgid(pid); err == nil {
		k.Pgid = pg
	}
	// Marked before the kill, so that the command's waiter sees it.
	g.mark(k)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		g.Killed(k.Pgid)
		return OOMKill{}, false
	}
	if g.Log != nil {
		g.Log.Printf("envd: out of memory: %d MiB of %d MiB in use, killed process %d (%s, %d MiB resident, group %d)", used>>20, limit>>20, pid, k.Comm, rss>>20, k.Pgid)
	}
	return k, true
}

// guardAloneEvery is how many polls apart the guard checks whether envd is
// alone in the sandbox (a process that outlives its command keeps it
// polling).
const guardAloneEvery = 20

// alone reports whether no process but init and self runs under proc.
func alone(proc string, self int) bool {
	ents, err := os.ReadDir(proc)
	if err != nil {
		return false
	}
	for _, e := range ents {
		if p, err := strconv.Atoi(e.Name()); err == nil && p != self && p != 1 {
			return false
		}
	}
	return true
}

// biggest returns the process under proc, other than self, init and
// envd's children not yet past their exec (they show envd's memory), with
// the most resident memory.
func biggest(proc string, self int) (pid int, rss int64) {
	ents, err := os.ReadDir(proc)
	if err != nil {
		return 0, 0
	}
	selfExe, _ := os.Readlink(proc + "/" + strconv.Itoa(self) + "/exe")
	page := int64(os.Getpagesize())
	buf := make([]byte, 128)
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil || p == self || p == 1 {
			continue
		}
		b, err := readSmall(proc+"/"+e.Name()+"/statm", buf)
		if err != nil {
			continue
		}
		// statm: size resident shared text lib data dt (pages).
		f := bytes.Fields(b)
		if len(f) < 2 {
			continue
		}
		r, err := strconv.ParseInt(string(f[1]), 10, 64)
		if err != nil {
			continue
		}
		if r*page <= rss {
			continue
		}
		if exe, err := os.Readlink(proc + "/" + e.Name() + "/exe"); err == nil && exe == selfExe && selfExe != "" {
			continue
		}
		pid, rss = p, r*page
	}
	return pid, rss
}

func readComm(proc string, pid int) string {
	b, err := readSmall(proc+"/"+strconv.Itoa(pid)+"/comm", make([]byte, 64))
	if err != nil {
		return "?"
	}
	return string(bytes.TrimSpace(b))
}

func readSmall(path string, buf []byte) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	n, err := f.Read(buf)
	if err != nil {
		return nil, err
	}
	return buf[:n], nil
}

// parseMeminfo returns MemTotal and MemAvailable in bytes.
func parseMeminfo(b []byte) (total, avail int64, ok bool) {
	var haveT, haveA bool
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		switch {
		case bytes.HasPrefix(line, []byte("MemTotal:")):
			total, haveT = kB(line[len("MemTotal:"):])
		case bytes.HasPrefix(line, []byte("MemAvailable:")):
			avail, haveA = kB(line[len("MemAvailable:"):])
		}
		if haveT && haveA {
			return total, avail, true
		}
	}
	return 0, 0, false
}

// kB parses "   524288 kB" into bytes.
func kB(b []byte) (int64, bool) {
	b = bytes.TrimSpace(bytes.TrimSuffix(bytes.TrimSpace(b), []byte("kB")))
	var n int64
	if len(b) == 0 {
		return 0, false
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n << 10, true
}

// markOOM makes end the end of a command whose process group lost a process
// to the guard: an error naming the cause and, when the guard killed the
// command itself, exit code 137 (what a shell reports for a child killed by
// SIGKILL, as by Linux's OOM killer). A command that outlived its killed
// child keeps its own exit code.
func markOOM(end *pb.ProcessEvent_EndEvent, k OOMKill) {
	msg := k.Message()
	end.Error = &msg
	if !end.Exited {
		end.ExitCode = 137
		end.Status = "signal: killed (out of memory)"
	}
}
