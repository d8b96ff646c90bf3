package bench

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// rolloutFake keeps each sandbox's files in memory and can fail the step
// of one child.
type rolloutFake struct {
	mu      sync.Mutex
	n       int
	files   map[string]map[string][]byte // by sandbox, by path
	steps   map[string]int               // steps run, by sandbox
	maxLive int
	// failChild, when > 0, makes the failChild-th fork child fail its
	// first step.
	failChild int
	children  int
}

func newRolloutFake() *rolloutFake {
	return &rolloutFake{files: map[string]map[string][]byte{}, steps: map[string]int{}}
}

func (f *rolloutFake) name() string { return "fake" }

func (f *rolloutFake) newBox(files map[string][]byte) string {
	f.n++
	id := fmt.Sprint("sb", f.n)
	f.files[id] = files
	f.maxLive = max(f.maxLive, len(f.files))
	return id
}

func (f *rolloutFake) spawn(context.Context) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.newBox(map[string][]byte{}), nil
}

func (f *rolloutFake) step(_ context.Context, id, path string, content []byte) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fs, ok := f.files[id]
	if !ok {
		return nil, fmt.Errorf("no sandbox %s", id)
	}
	if f.steps[id] < 0 {
		return nil, errors.New("step failed")
	}
	f.steps[id]++
	fs[path] = append([]byte(nil), content...)
	return fs[path], nil
}

func (f *rolloutFake) fork(_ context.Context, id string, n int) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var kids []string
	for range n {
		files := map[string][]byte{}
		for p, b := range f.files[id] {
			files[p] = b
		}
		kid := f.newBox(files)
		f.children++
		if f.children == f.failChild {
			f.steps[kid] = -1
		}
		kids = append(kids, kid)
	}
	return kids, nil
}

func (f *rolloutFake) kill(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.files[id]; !ok {
		return fmt.Errorf("kill %s: no such sandbox", id)
	}
	delete(f.files, id)
	return nil
}

func TestStepContent(t *testing.T) {
	a, b := stepContent(3, 5), stepContent(3, 6)
	if len(a) != rolloutFileBytes || a[len(a)-1] != '\n' || !strings.HasPrefix(string(a), "rollout 3 step 5 ") {
		t.Errorf("stepContent(3, 5) = %q (%d bytes), want %d bytes naming rollout 3 step 5, ending in a newline", a, len(a), rolloutFileBytes)
	}
	if string(a) == string(b) {
		t.Error("two steps write the same content")
	}
}

func TestForks(t *testing.T) {
	var got []int
	for k := range 12 {
		if forks(k) {
			got = append(got, k)
		}
	}
	if fmt.Sprint(got) != "[3 7 11]" {
		t.Errorf("forking rollouts of 0..11 = %v, want every 4th: [3 7 11]", got)
	}
}

func TestRollout(t *testing.T) {
	tests := []struct {
		name         string
		k, failChild int
		wantEpisodes int
		wantSteps    int // latencies recorded
		wantErr      bool
	}{
		{"plain", 0, 0, 1, rolloutSteps, false},
		{"forking", 3, 0, rolloutChildren, rolloutForkAt + rolloutChildren*(rolloutSteps-rolloutForkAt), false},
		{"a child fails", 3, 2, rolloutChildren - 1, rolloutForkAt + (rolloutChildren-1)*(rolloutSteps-rolloutForkAt), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newRolloutFake()
			f.failChild = tt.failChild
			var mu sync.Mutex
			var steps int
			n, err := rollout(context.Background(), f, tt.k, func(time.Duration) { mu.Lock(); steps++; mu.Unlock() })
			if n != tt.wantEpisodes || (err != nil) != tt.wantErr {
				t.Errorf("rollout = %d, %v; want %d episodes, error %v", n, err, tt.wantEpisodes, tt.wantErr)
			}
			if steps != tt.wantSteps {
				t.Errorf("recorded %d step latencies, want %d", steps, tt.wantSteps)
			}
			if len(f.files) != 0 {
				t.Errorf("%d sandboxes left alive, want every one killed", len(f.files))
			}
		})
	}
}

// wrongOutput is a target whose command prints something else than the
// file written.
type wrongOutput struct{ *rolloutFake }

func (w wrongOutput) step(context.Context, string, string, []byte) ([]byte, error) {
	return []byte("nope"), nil
}

func TestRolloutChecksTheOutput(t *testing.T) {
	f := newRolloutFake()
	_, err := rollout(context.Background(), wrongOutput{f}, 0, func(time.Duration) {})
	if err == nil || !strings.Contains(err.Error(), "step 1") {
		t.Errorf("rollout with a wrong output: got %v, want an error naming step 1", err)
	}
	if len(f.files) != 0 {
		t.Errorf("%d sandboxes left alive after a failed step, want 0", len(f.files))
	}
}

func TestRunRollouts(t *testing.T) {
	f := newRolloutFake()
	got, err := runRollouts(context.Background(), f, 4, 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	forking := 0
	for k := range got.Started {
		if forks(k) {
			forking++
		}
	}
	if want := got.Started - forking + forking*rolloutChildren; got.Rollouts != want || got.Failed != 0 {
		t.Errorf("%d started (%d forking): %d rollouts, %d failed; want %d, 0", got.Started, forking, got.Rollouts, got.Failed, want)
	}
	if got.Agents != 4 || got.PerSecond <= 0 || got.Step.N == 0 {
		t.Errorf("level = %+v, want 4 agents, a rate and step latencies", got)
	}
	if len(f.files) != 0 {
		t.Errorf("%d sandboxes left alive, want 0", len(f.files))
	}
}

func rolloutReport() Report {
	lvl := func(agents int, perSec, cpuS float64, rollouts int) RolloutLevel {
		return RolloutLevel{Agents: agents, Rollouts: rollouts, Started: rollouts, PerSecond: perSec, CPUSeconds: cpuS,
			PerCoreSecond: float64(rollouts) / cpuS, Step: Stats{N: 8, P50Ms: 20, P95Ms: 35}, HostCPUBusy: 0.5}
	}
	return Report{Rollout: &RolloutReport{
		Steps: 8, ForkEvery: 4, ForkAtStep: 4, Children: 4, FileBytes: 256, Seconds: 5,
		Levels: []int{1, 2, 4, 8, 16}, Headline: 8, Targets: []string{TargetAgentenv, TargetRunsc},
		ByTarget: map[string][]RolloutLevel{
			TargetAgentenv: {lvl(1, 2, 2, 10), lvl(2, 4, 5, 20), lvl(4, 6, 10, 30), lvl(8, 6.5, 10, 32), lvl(16, 6, 10, 30)},
			TargetRunsc:    {lvl(1, 1, 4, 5), lvl(2, 2, 5, 10), lvl(4, 3, 7.5, 15), lvl(8, 3.25, 8, 16), lvl(16, 3, 7.5, 15)},
		},
	}}
}

func TestWriteRollout(t *testing.T) {
	var b strings.Builder
	if err := writeRollout(&b, rolloutReport()); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"agentenv /s", "runsc /s", "agentenv per core-s", "agentenv CPU ms/rollout", "runsc step p50 / p95 ms",
		"2.0x",         // rollouts/s at 8 agents: 6.5 / 3.25
		"3.20", "2.00", // per core-second at 8: 32/10, 16/8
		"312", "500", // CPU ms per rollout at 8: 10 s / 32, 8 s / 16
		"20.0 / 35.0", // step p50 / p95
		"6.50 (50%)",  // rollouts/s with the host's busy share
		"headline, 8 agents: agentenv 6.50 rollouts/s, 3.20 per core-second; runsc 3.25 rollouts/s, 2.00 per core-second",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("rollout table lacks %q; got:\n%s", want, out)
		}
	}
}

func TestWriteRolloutSVG(t *testing.T) {
	rep := rolloutReport()
	var b strings.Builder
	if err := WriteRolloutSVG(&b, rep); err != nil {
		t.Fatal(err)
	}
	type point struct {
		target string
		x, y   float64
	}
	var points []point
	dec := xml.NewDecoder(strings.NewReader(b.String()))
	root := ""
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v\n%s", err, b.String())
		}
		se, ok := tok.(xml.StartElement)
		if !ok {
			continue
		}
		if root == "" {
			root = se.Name.Local
		}
		if se.Name.Local != "circle" {
			continue
		}
		var p point
		for _, a := range se.Attr {
			switch a.Name.Local {
			case "cx":
				p.x, _ = strconv.ParseFloat(a.Value, 64)
			case "cy":
				p.y, _ = strconv.ParseFloat(a.Value, 64)
			case "fill":
				p.target = a.Value
			}
		}
		points = append(points, p)
	}
	if root != "svg" {
		t.Errorf("root element %q, want svg", root)
	}
	if len(points) != 10 {
		t.Fatalf("%d points, want 5 levels × 2 targets", len(points))
	}
	a, r := points[:5], points[5:]
	for i := 1; i < 5; i++ {
		if a[i].x <= a[i-1].x {
			t.Errorf("x of %d agents (%v) not right of the level before (%v)", rep.Rollout.Levels[i], a[i].x, a[i-1].x)
		}
	}
	// Log scale: 1, 2, 4, 8 and 16 agents are evenly spaced.
	if d1, d2 := a[1].x-a[0].x, a[4].x-a[3].x; d1-d2 > 0.2 || d2-d1 > 0.2 {
		t.Errorf("x steps %v and %v, want equal steps on a log scale", d1, d2)
	}
	// More rollouts/s is higher up (smaller y); the same value, the same y.
	if !(a[0].y > a[1].y && a[1].y > a[3].y) {
		t.Errorf("agentenv y = %v, %v, %v for 2, 4, 6.5 rollouts/s; want decreasing", a[0].y, a[1].y, a[3].y)
	}
	if a[2].y != a[4].y {
		t.Errorf("agentenv at 4 and 16 agents, both 6 rollouts/s: y %v and %v, want equal", a[2].y, a[4].y)
	}
	if r[0].y <= a[0].y {
		t.Errorf("runsc at 1 rollout/s (y %v) is not below agentenv at 2 (y %v)", r[0].y, a[0].y)
	}
	if a[0].target == r[0].target {
		t.Error("both targets' points have the same colour")
	}
	if err := WriteRolloutSVG(io.Discard, Report{}); err == nil {
		t.Error("plot without rollout results: got nil error, want one")
	}
}

func TestNiceCeil(t *testing.T) {
	for in, want := range map[float64]float64{0: 1, 0.7: 1, 1.2: 2, 3: 5, 7.1: 10, 42: 50, 150: 200} {
		if got := niceCeil(in); got != want {
			t.Errorf("niceCeil(%v) = %v, want %v", in, got, want)
		}
	}
}
