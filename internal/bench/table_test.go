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
		"template busybox; 20 iterations (after 1 warm-up)",
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

func TestWriteTableSnapshotRows(t *testing.T) {
	rep := Report{
		Template: "busybox", Iterations: 20, Warmup: 1, HeavyIterations: 5,
		ChurnSeconds: 10, ChurnInFlight: 8, Density: 10,
		Targets: []string{TargetAgentenv, TargetRunsc, TargetCrun},
		Stats: map[string]map[Operation]Stats{
			TargetAgentenv: {OpPause: {N: 20, P50Ms: 8, P95Ms: 9, MaxMs: 10}},
			TargetRunsc:    {OpPause: {N: 20, P50Ms: 4, P95Ms: 5, MaxMs: 6}},
		},
		Churn: map[string]Throughput{
			TargetAgentenv: {Cycles: 100, PerSecond: 10},
			TargetRunsc:    {Cycles: 200, PerSecond: 20},
			TargetCrun:     {Cycles: 800, PerSecond: 80},
		},
		Memory: map[string]map[Operation]Memory{
			TargetAgentenv: {OpMemIdle: {Sandboxes: 10, PssMiB: 15}, OpMemFork: {Sandboxes: 10, PssMiB: 20}},
			TargetRunsc:    {OpMemIdle: {Sandboxes: 10, PssMiB: 10}, OpMemFork: {Sandboxes: 10, PssMiB: 10}},
			TargetCrun:     {OpMemIdle: {Sandboxes: 10, PssMiB: 0.25}},
		},
	}
	var b strings.Builder
	if err := WriteTable(&b, rep); err != nil {
		t.Fatal(err)
	}
	rows := map[Operation]string{}
	for _, line := range strings.Split(b.String(), "\n") {
		for _, op := range Operations {
			if strings.HasPrefix(line, op.Label()+" ") {
				rows[op] = strings.Join(strings.Fields(strings.TrimPrefix(line, op.Label())), " ")
			}
		}
	}
	tests := []struct {
		op   Operation
		want string // cells after the label, single-spaced
	}{
		// crun cannot pause: its cell and ratio are "-".
		{OpPause, "8.0 / 9.0 / 10.0 4.0 / 5.0 / 6.0 - 2.0x -"},
		{OpChurn, "10.0/s 20.0/s 80.0/s 0.5x 0.1x"},
		{OpMemIdle, "15.0 10.0 0.2 1.5x 60.0x"},
		{OpMemFork, "20.0 10.0 - 2.0x -"},
	}
	for _, tt := range tests {
		if got := rows[tt.op]; got != tt.want {
			t.Errorf("row %q = %q, want %q", tt.op.Label(), got, tt.want)
		}
	}
	// Rows nobody measured are left out.
	for _, op := range []Operation{OpCreate, OpSnapshot, OpFork16} {
		if _, ok := rows[op]; ok {
			t.Errorf("row %q printed without samples", op.Label())
		}
	}
	for _, want := range []string{"5 for dirty snapshots and forks", "churn 8 in flight for 10s per target", "memory with 10 sandboxes"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("header lacks %q; got:\n%s", want, b.String())
		}
	}
}

func TestParseGroups(t *testing.T) {
	all, err := ParseGroups("")
	if err != nil || len(all) != len(DefaultGroups) || all[GroupDensity] || all[GroupRL] {
		t.Errorf("ParseGroups(\"\") = %v, %v; want the %d default groups, without density and rl", all, err, len(DefaultGroups))
	}
	for _, g := range []string{GroupDensity, GroupRL} {
		if got, err := ParseGroups(g); err != nil || !got[g] {
			t.Errorf("ParseGroups(%q) = %v, %v; want %s", g, got, err, g)
		}
	}
	got, err := ParseGroups("pause, fork")
	if err != nil || len(got) != 2 || !got[GroupPause] || !got[GroupFork] {
		t.Errorf("ParseGroups(\"pause, fork\") = %v, %v; want pause and fork", got, err)
	}
	if _, err := ParseGroups("pause,forks"); err == nil {
		t.Error("ParseGroups with an unknown group: got nil error, want one")
	}
}

func TestEveryOperationHasALabelAndGroup(t *testing.T) {
	seen := map[Operation]bool{}
	for _, op := range Operations {
		if seen[op] {
			t.Errorf("operation %q listed twice", op)
		}
		seen[op] = true
		info, ok := ops[op]
		if !ok || info.label == "" {
			t.Errorf("operation %q has no label", op)
		}
		if _, err := ParseGroups(info.group); err != nil || info.group == "" {
			t.Errorf("operation %q has group %q: %v", op, info.group, err)
		}
	}
	if len(seen) != len(ops) {
		t.Errorf("Operations lists %d rows, ops describes %d", len(seen), len(ops))
	}
}

func TestWriteTableCreateLabel(t *testing.T) {
	for _, tt := range []struct {
		ready bool
		want  string
	}{
		{false, "create (boot) until a command runs"},
		{true, "create (ready template) until a command runs"},
	} {
		rep := Report{Template: "busybox", Iterations: 1, Targets: []string{TargetAgentenv}, ReadyTemplate: tt.ready,
			Stats: map[string]map[Operation]Stats{TargetAgentenv: {OpCreate: {N: 1, P50Ms: 1, P95Ms: 1, MaxMs: 1}}}}
		var b strings.Builder
		if err := WriteTable(&b, rep); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(b.String(), tt.want) {
			t.Errorf("ready template %v: table lacks %q; got:\n%s", tt.ready, tt.want, b.String())
		}
	}
}
