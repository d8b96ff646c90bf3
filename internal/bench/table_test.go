package bench

import (
	"strings"
	"testing"
)

func TestWriteTable(t *testing.T) {
	rep := Report{
		Template: "busybox", Iterations: 20, Warmup: 1,
		Targets: []string{TargetAgentenv, TargetRunsc, TargetCrun},
		Stats: map[string]map[Operation]Stats{
			TargetAgentenv: {
				OpCreate: {N: 20, P50Ms: 150, P95Ms: 180.4, MaxMs: 201},
				OpExec:   {N: 20, P50Ms: 4, P95Ms: 5.25, MaxMs: 9},
			},
			TargetRunsc: {
				OpCreate: {N: 20, P50Ms: 100, P95Ms: 110, MaxMs: 120},
				OpExec:   {N: 20, P50Ms: 10, P95Ms: 12, MaxMs: 13},
			},
			TargetCrun: {
				OpCreate: {N: 20, P50Ms: 15, P95Ms: 16, MaxMs: 17},
			},
		},
		Notes: []string{"crun: note"},
	}
	var b strings.Builder
	if err := WriteTable(&b, rep); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"template busybox, 20 iterations (after 1 warm-up)",
		"agentenv/runsc", "agentenv/crun",
		"150 / 180 / 201", // three digits: no decimals
		"4.0 / 5.2 / 9.0", // below 100 ms: one decimal
		"1.5x", "10.0x",   // create: 150/100 and 150/15
		"0.4x", // exec: 4/10
		"  crun: note",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q; got:\n%s", want, out)
		}
	}
	// exec has no crun samples: its cell and ratio are "-".
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, OpExec.Label()) {
			if got := strings.Count(line, " - "); got < 1 || !strings.HasSuffix(strings.TrimSpace(line), "-") {
				t.Errorf("exec row without crun samples: got %q, want '-' for crun and its ratio", line)
			}
		}
	}
}

func TestWriteTableAgentenvOnly(t *testing.T) {
	rep := Report{Template: "busybox", Iterations: 3, Targets: []string{TargetAgentenv},
		Stats: map[string]map[Operation]Stats{TargetAgentenv: {OpKill: {N: 3, P50Ms: 2, P95Ms: 3, MaxMs: 3}}}}
	var b strings.Builder
	if err := WriteTable(&b, rep); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "agentenv/") {
		t.Errorf("agentenv-only table has a ratio column; got:\n%s", b.String())
	}
	if !strings.Contains(b.String(), "2.0 / 3.0 / 3.0") {
		t.Errorf("kill row missing; got:\n%s", b.String())
	}
}
