package api

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"

	wire "github.com/agentenv/agentenv/client/api"
	"github.com/agentenv/agentenv/internal/imagebuild"
	"github.com/agentenv/agentenv/internal/template"
)

// noisySteps is a step builder whose one RUN prints bytes of numbered
// lines of about 1 KiB ("line 00000042 ..."), with one line of a MiB
// without a newline in the middle.
type noisySteps struct{ bytes int }

const noisyLine = 1 << 10

func (n noisySteps) lines() int { return n.bytes / noisyLine }

func (n noisySteps) Prepare(ctx context.Context, spec imagebuild.Spec, log func(imagebuild.LogEntry)) (template.BuildRequest, func(), error) {
	pad := strings.Repeat("x", noisyLine-len("line 00000000 "))
	for i := range n.lines() {
		log(imagebuild.LogEntry{Level: "info", Step: "1", Message: fmt.Sprintf("line %08d %s", i, pad)})
		if i == n.lines()/2 {
			log(imagebuild.LogEntry{Level: "info", Step: "1", Message: strings.Repeat("y", 1<<20)})
		}
	}
	return template.BuildRequest{Name: spec.Name}, func() {}, nil
}

// build runs one build of name to its end and returns the log as the SDK
// reads it.
func (e *stepEnv) build(name string) []wire.BuildLogEntry {
	e.t.Helper()
	r := e.create(name)
	if code, body := e.do("POST", "/v2/templates/"+name+"/builds/"+r.BuildID, wire.TemplateBuildStartV2{FromTemplate: "base"}, nil); code != http.StatusAccepted {
		e.t.Fatalf("start: HTTP %d %s", code, body)
	}
	info, all := e.wait(name, r.BuildID)
	if info.Status != statusReady {
		e.t.Fatalf("build %s: status %s, want ready", name, info.Status)
	}
	return all
}

// A build that prints 200 MB keeps no more than its bound in the server:
// the client still gets the first and the last lines, in order, and a
// line saying how much was dropped between them.
func TestStepBuildLogBounded(t *testing.T) {
	const perBuild, total = 1 << 20, 4 << 20
	steps := noisySteps{bytes: 200 << 20}
	e := newStepEnv(t, nil, func(c *TemplateBuildsConfig) {
		c.Steps, c.MaxLogBytes, c.MaxLogBytesTotal = steps, perBuild, total
	})
	// What the log lines say beside the build's (a few short lines).
	const slack = 16 << 10
	for round := 1; round <= 2; round++ {
		all := e.build(fmt.Sprintf("noisy%d", round))
		used, peak := e.builds.logs.stats()
		if used > int64(round)*(perBuild+slack) || peak > int64(round)*(perBuild+slack) {
			t.Errorf("after %d builds of a 200 MB log: the log store holds %d bytes (at most %d), want at most %d", round, used, peak, round*(perBuild+slack))
		}
		last, dropped := -1, ""
		for _, en := range all {
			var n int
			if _, err := fmt.Sscanf(en.Message, "line %d ", &n); err == nil {
				if n <= last {
					t.Fatalf("line %d after line %d: the log the client reads is out of order or repeats", n, last)
				}
				last = n
				continue
			}
			if strings.Contains(en.Message, "were dropped") {
				dropped = en.Message
			}
		}
		if len(all) == 0 || !strings.HasPrefix(all[1].Message, "line 00000000 ") {
			t.Errorf("the client's log does not start with the build's first line")
		}
		if last != steps.lines()-1 {
			t.Errorf("the client's last line of the build is %d, want %d (the log's tail)", last, steps.lines()-1)
		}
		if dropped == "" {
			t.Errorf("no line says what was dropped")
		}
		if !strings.HasPrefix(all[len(all)-1].Message, "Build finished") {
			t.Errorf("last line %q, want the build's end", all[len(all)-1].Message)
		}
		t.Logf("round %d: %d entries reach the client; %q; store holds %d bytes", round, len(all), dropped, used)
	}
}

// All builds' logs together stay under the total: the oldest finished
// builds' logs go first, and their status says so.
func TestStepBuildLogsTotalBounded(t *testing.T) {
	const perBuild, total = 1 << 20, 3 << 20
	e := newStepEnv(t, nil, func(c *TemplateBuildsConfig) {
		c.Steps, c.MaxLogBytes, c.MaxLogBytesTotal = noisySteps{bytes: 4 << 20}, perBuild, total
	})
	var ids []string
	for i := range 6 {
		name := fmt.Sprintf("t%d", i)
		r := e.create(name)
		e.do("POST", "/v2/templates/"+name+"/builds/"+r.BuildID, wire.TemplateBuildStartV2{FromTemplate: "base"}, nil)
		e.wait(name, r.BuildID)
		ids = append(ids, r.BuildID)
	}
	used, peak := e.builds.logs.stats()
	if peak > total+16<<10 {
		t.Errorf("6 builds of %d bytes of log each, total bound %d: the log store held up to %d (now %d)", perBuild, total, peak, used)
	}
	var info wire.TemplateBuildInfo
	e.do("GET", "/templates/t0/builds/"+ids[0]+"/status", nil, &info)
	if len(info.LogEntries) != 1 || !strings.Contains(info.LogEntries[0].Message, "discarded") {
		t.Errorf("the oldest build's log: %d entries, want one saying it was discarded", len(info.LogEntries))
	}
	// Forgotten builds give their bytes back.
	e.builds.mu.Lock()
	e.builds.cfg.MaxRecords = 1
	e.builds.trimLocked()
	e.builds.mu.Unlock()
	if used, _ := e.builds.logs.stats(); used > perBuild+16<<10 {
		t.Errorf("one build remembered: the log store holds %d bytes, want at most one build's", used)
	}
}

// The log store's edges: a long line is cut on a character boundary, a
// line larger than the ring is dropped (and counted), a running build's
// log is never discarded, and what a log held goes back to the budget.
func TestBuildLogEdges(t *testing.T) {
	budget := &logBudget{max: 1 << 20}
	l := newBuildLog(64<<10, budget)
	long := strings.Repeat("é", maxEntryBytes) // 2 bytes each
	l.add(wire.BuildLogEntry{Level: "info", Message: long})
	got := l.shown[0].Message
	if !utf8.ValidString(got) || len(got) > maxEntryBytes+64 || !strings.Contains(got, "bytes of this line cut") {
		t.Errorf("a %d-byte line became %d bytes (valid UTF-8: %v), want it cut to about %d with a note", len(long), len(got), utf8.ValidString(got), maxEntryBytes)
	}
	for i := 0; !l.held; i++ {
		l.add(wire.BuildLogEntry{Level: "info", Message: fmt.Sprintf("line %d", i)})
	}
	l.add(wire.BuildLogEntry{Level: "info", Message: strings.Repeat("z", maxEntryBytes)}) // fits the 16 KiB ring
	l.discard()
	if l.discarded {
		t.Errorf("a running build's log was discarded")
	}
	if !l.end(wire.BuildLogEntry{Level: "info", Message: "end"}) || l.end(wire.BuildLogEntry{Message: "again"}) {
		t.Errorf("end: want true once, then false")
	}
	if last := l.shown[len(l.shown)-1].Message; last != "end" {
		t.Errorf("last line %q, want end", last)
	}
	if used, _ := budget.stats(); used != l.bytes() {
		t.Errorf("budget counts %d bytes, the log holds %d", used, l.bytes())
	}
	l.discard()
	if len(l.shown) != 1 || !strings.Contains(l.shown[0].Message, "discarded") {
		t.Errorf("after discard: %d lines, want one saying so", len(l.shown))
	}
	l.release()
	if used, _ := budget.stats(); used != 0 {
		t.Errorf("after release the budget counts %d bytes, want 0", used)
	}

	// A ring smaller than a line: the line is dropped and counted.
	small := newBuildLog(8<<10, &logBudget{max: 1 << 20})
	small.add(wire.BuildLogEntry{Message: "first"})
	small.add(wire.BuildLogEntry{Message: strings.Repeat("w", 7<<10)})
	small.add(wire.BuildLogEntry{Message: strings.Repeat("v", 4<<10)})
	if small.dropped == 0 || !small.held {
		t.Errorf("lines larger than a 2 KiB ring: dropped %d, held %v; want them dropped", small.dropped, small.held)
	}
}
