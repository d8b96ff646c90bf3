package api

import (
	"fmt"
	"sync"
	"unicode/utf8"

	wire "github.com/agentenv/agentenv/client/api"
)

// Build logs are bounded per build and in total. E2B's SDKs page through
// a build's log by offset (the count of entries they already got), so
// what a build shows by offset only ever grows at its end: the first
// lines as they come, until the build's head budget is spent; later lines
// wait in a ring of the last tail bytes, and when the build ends a line
// saying how much was dropped is shown, then the ring. The time-cursor
// route (logsFrom) sees the ring as it is. When all builds' logs together
// pass the total, the oldest finished builds' logs are discarded first.

const (
	// DefaultMaxLogBytes is one build's log bound unless the operator
	// says otherwise (serve --build-log-mb).
	DefaultMaxLogBytes = 8 << 20
	// DefaultMaxLogBytesTotal bounds all builds' logs together (serve
	// --build-logs-total-mb).
	DefaultMaxLogBytesTotal = 64 << 20
	// maxEntryBytes cuts one line's message (a step printing without a
	// newline).
	maxEntryBytes = 16 << 10
	// entryOverhead is what an entry costs beside its strings.
	entryOverhead = 64
)

// logBudget counts the bytes every build's log holds, and keeps the
// finished builds oldest first, whose logs go first when it runs short.
// Its lock is taken last (after a build's).
type logBudget struct {
	max int64

	mu    sync.Mutex
	used  int64
	peak  int64
	ended []*stepBuild
}

// finished queues b, whose log ended, for reclaim.
func (lb *logBudget) finished(b *stepBuild) {
	lb.mu.Lock()
	lb.ended = append(lb.ended, b)
	lb.mu.Unlock()
}

// forget drops b (no longer remembered) from the queue.
func (lb *logBudget) forget(b *stepBuild) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	for i, x := range lb.ended {
		if x == b {
			lb.ended = append(lb.ended[:i], lb.ended[i+1:]...)
			return
		}
	}
}

// reclaim discards the oldest finished builds' logs while less than a
// quarter of the budget is left. The caller holds no build's lock.
func (lb *logBudget) reclaim() {
	for {
		lb.mu.Lock()
		if lb.used <= lb.max-lb.max/4 || len(lb.ended) == 0 {
			lb.mu.Unlock()
			return
		}
		b := lb.ended[0]
		lb.ended = lb.ended[1:]
		lb.mu.Unlock()
		b.mu.Lock()
		b.log.discard()
		b.mu.Unlock()
	}
}

func (lb *logBudget) take(n int64) bool {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	if lb.used+n > lb.max {
		return false
	}
	lb.used += n
	lb.peak = max(lb.peak, lb.used)
	return true
}

// force takes n whatever is left: the few lines that say what was dropped
// and how a build ended are always kept.
func (lb *logBudget) force(n int64) {
	lb.mu.Lock()
	lb.used += n
	lb.peak = max(lb.peak, lb.used)
	lb.mu.Unlock()
}

func (lb *logBudget) give(n int64) {
	lb.mu.Lock()
	lb.used -= n
	lb.mu.Unlock()
}

func (lb *logBudget) stats() (used, peak int64) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	return lb.used, lb.peak
}

// buildLog is one build's log. Its owner (stepBuild) locks it.
type buildLog struct {
	max    int64 // bytes shown and held together
	tail   int64 // bytes the ring holds at most
	budget *logBudget

	shown      []wire.BuildLogEntry
	shownBytes int64
	held       bool                 // the head budget is spent: new lines go to the ring
	ring       []wire.BuildLogEntry // ring[start:] oldest first
	start      int
	ringBytes  int64
	dropped    int64 // lines dropped, and their messages' bytes
	dropBytes  int64
	ended      bool
	discarded  bool
}

func newBuildLog(maxBytes int64, budget *logBudget) *buildLog {
	return &buildLog{max: maxBytes, tail: maxBytes / 4, budget: budget}
}

func entrySize(e wire.BuildLogEntry) int64 {
	return int64(len(e.Message)+len(e.Step)+len(e.Level)) + entryOverhead
}

// cut shortens a message past maxEntryBytes, on a character boundary.
func cut(msg string) string {
	if len(msg) <= maxEntryBytes {
		return msg
	}
	n := maxEntryBytes
	for n > 0 && !utf8.RuneStart(msg[n]) {
		n--
	}
	return fmt.Sprintf("%s … (%d more bytes of this line cut)", msg[:n], len(msg)-n)
}

// add appends a line: shown if the head has room, else held in the ring,
// dropping the ring's oldest lines to make room.
func (l *buildLog) add(e wire.BuildLogEntry) {
	if l.ended {
		return
	}
	e.Message = cut(e.Message)
	n := entrySize(e)
	if !l.held && l.shownBytes+n <= l.max-l.tail && l.budget.take(n) {
		l.shown = append(l.shown, e)
		l.shownBytes += n
		return
	}
	if !l.held {
		l.held = true
		l.force(wire.BuildLogEntry{Timestamp: e.Timestamp, Level: "warn", Step: e.Step,
			Message: fmt.Sprintf("this build's log passed %s (the most this server shows of a build as it runs): later lines are held back, and the last %s of them are shown when the build ends", mib(l.max-l.tail), mib(l.tail))})
	}
	for l.ringBytes+n > l.tail || !l.budget.take(n) {
		if l.start == len(l.ring) {
			l.dropped++
			l.dropBytes += int64(len(e.Message))
			return
		}
		old := l.ring[l.start]
		l.ring[l.start] = wire.BuildLogEntry{}
		l.start++
		m := entrySize(old)
		l.ringBytes -= m
		l.budget.give(m)
		l.dropped++
		l.dropBytes += int64(len(old.Message))
	}
	if l.start > len(l.ring)/2 {
		l.ring = append(l.ring[:0], l.ring[l.start:]...)
		l.start = 0
	}
	l.ring = append(l.ring, e)
	l.ringBytes += n
}

// force shows e whatever the bounds.
func (l *buildLog) force(e wire.BuildLogEntry) {
	n := entrySize(e)
	l.budget.force(n)
	l.shown = append(l.shown, e)
	l.shownBytes += n
}

// end shows what was held (after a line saying what was dropped) and
// then e, the build's last line; later lines are ignored. It reports
// whether the log ended now.
func (l *buildLog) end(e wire.BuildLogEntry) bool {
	if l.ended {
		return false
	}
	if l.dropped > 0 {
		l.force(wire.BuildLogEntry{Timestamp: e.Timestamp, Level: "warn", Step: e.Step,
			Message: fmt.Sprintf("%d log lines (%s) were dropped here: this server keeps %s of a build's log (serve --build-log-mb); the last %d lines follow", l.dropped, mib(l.dropBytes), mib(l.max), len(l.ring)-l.start)})
	}
	for _, r := range l.ring[l.start:] {
		l.shown = append(l.shown, r)
		l.shownBytes += entrySize(r)
	}
	l.ring, l.start, l.ringBytes = nil, 0, 0
	l.force(e)
	l.ended = true
	return true
}

// discard frees the log of a finished build, leaving one line that says
// so.
func (l *buildLog) discard() {
	if !l.ended || l.discarded {
		return
	}
	freed := l.shownBytes
	note := wire.BuildLogEntry{Level: "warn", Message: fmt.Sprintf("the log of this build (%d lines) was discarded to keep this server's build logs under %s in total (serve --build-logs-total-mb)", len(l.shown), mib(l.budget.max))}
	if len(l.shown) > 0 {
		note.Timestamp = l.shown[len(l.shown)-1].Timestamp
	}
	l.budget.give(freed)
	l.shown, l.shownBytes, l.discarded = nil, 0, true
	l.force(note)
}

// each calls f on every entry kept, shown then held, oldest first.
func (l *buildLog) each(f func(wire.BuildLogEntry)) {
	for _, e := range l.shown {
		f(e)
	}
	for _, e := range l.ring[l.start:] {
		f(e)
	}
}

// count is how many entries the log keeps, shown and held; at(i) is the
// i-th of them, oldest first.
func (l *buildLog) count() int { return len(l.shown) + len(l.ring) - l.start }

func (l *buildLog) at(i int) wire.BuildLogEntry {
	if i < len(l.shown) {
		return l.shown[i]
	}
	return l.ring[l.start+i-len(l.shown)]
}

// bytes is what the log holds.
func (l *buildLog) bytes() int64 { return l.shownBytes + l.ringBytes }

// release gives back everything the log holds (its build is forgotten).
func (l *buildLog) release() {
	l.budget.give(l.bytes())
	l.shown, l.ring, l.start, l.shownBytes, l.ringBytes = nil, nil, 0, 0, 0
	l.ended, l.discarded = true, true
}

func mib(n int64) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%d KiB", n>>10)
}
