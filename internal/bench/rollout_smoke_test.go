package bench

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/testenv"
)

// TestRolloutSmoke runs the rollout group for real with tiny counts: a
// server the bench starts, raw runsc beside it, CPU counted in cgroups.
// Four agents for a moment start one rollout each, the fourth of which
// forks: 3 + 4 finished episodes per target.
func TestRolloutSmoke(t *testing.T) {
	testenv.NeedRunsc(t)
	testenv.NeedCommand(t, "mkfs.erofs", "the raw runsc target runs an EROFS image of busybox")
	bin := testenv.BuildAgentenv(t, t.TempDir())
	before := benchCgroups()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cfg := Config{
		Serve: ServeOptions{Binary: bin, NetworkCIDR: "10.226.16.0/20", NetworkTag: "bnt"},
		Only:  map[string]bool{GroupRollout: true}, Iterations: 1, HeavyIterations: 1,
		RolloutLevels: []int{4}, RolloutDuration: 200 * time.Millisecond, Progress: testLog{t},
	}
	var out strings.Builder
	rep, err := Run(ctx, cfg, &out)
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, out.String())
	}
	t.Log("\n" + out.String())
	ro := rep.Rollout
	if ro == nil {
		t.Fatal("no rollout results")
	}
	_, counted := ro.IdleMsPerS[TargetAgentenv]
	for _, target := range []string{TargetAgentenv, TargetRunsc} {
		levels := ro.ByTarget[target]
		if len(levels) != 1 {
			t.Fatalf("%s: %d levels, want 1", target, len(levels))
		}
		for _, l := range levels {
			want := rolloutChildren + 3
			if l.Started != 4 || l.Rollouts != want || l.Failed != 0 || l.Step.N != 3*rolloutSteps+rolloutForkAt+rolloutChildren*(rolloutSteps-rolloutForkAt) {
				t.Errorf("%s: %d started, %d rollouts, %d failed (%s), %d steps; want 4 started, %d rollouts, none failed", target, l.Started, l.Rollouts, l.Failed, l.FirstError, l.Step.N, want)
			}
			if counted && l.PerCoreSecond <= 0 {
				t.Errorf("%s with %d agents: no rollouts per core-second though CPU is counted", target, l.Agents)
			}
		}
	}
	if !strings.Contains(out.String(), "headline, 4 agents") {
		t.Errorf("table has no headline at 4 agents:\n%s", out.String())
	}
	var svg strings.Builder
	if err := WriteRolloutSVG(&svg, rep); err != nil || strings.Count(svg.String(), "<circle") != 2 {
		t.Errorf("plot: %v, %d points; want 2", err, strings.Count(svg.String(), "<circle"))
	}
	for name := range benchCgroups() {
		if !before[name] {
			t.Errorf("cgroup %s left behind", name)
		}
	}
}

// benchCgroups are the bench cgroups that exist now.
func benchCgroups() map[string]bool {
	out := map[string]bool{}
	root, _, err := findCgroup2()
	if err != nil {
		return out
	}
	entries, _ := os.ReadDir(root)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "agentenv-bench-") {
			out[e.Name()] = true
		}
	}
	return out
}

// testLog writes the bench's progress lines to the test log.
type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
