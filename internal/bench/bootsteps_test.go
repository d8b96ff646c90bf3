package bench

import (
	"strings"
	"testing"

	"github.com/agentenv/agentenv/client"
)

func TestBootStepsTable(t *testing.T) {
	cpu := func(v float64) *float64 { return &v }
	var r bootRecorder
	r.add(&client.BootRecord{Kind: "create"}) // off: not kept
	r.on = true
	for _, wall := range []float64{10, 30, 20} {
		r.add(&client.BootRecord{Kind: "create", Steps: []client.BootStep{
			{Step: "slot", WallMs: 1},
			{Step: "boot", WallMs: wall, CPUMs: cpu(wall / 2)},
		}})
	}
	r.add(&client.BootRecord{Kind: "restore", Steps: []client.BootStep{{Step: "slot", WallMs: 1}, {Step: "restore", WallMs: 5, CPUMs: cpu(4)}}})
	got := summarizeBoots(r.byKey["create"])
	if len(got) != 2 || got[0].Step != "slot" || got[1].Step != "boot" {
		t.Fatalf("got steps %+v, want slot then boot", got)
	}
	if got[1].N != 3 || got[1].WallP50Ms != 20 || got[1].CPUP50Ms == nil || *got[1].CPUP50Ms != 10 {
		t.Errorf("boot: got %+v, want n 3, wall p50 20, cpu p50 10", got[1])
	}
	if got[0].CPUP50Ms != nil {
		t.Errorf("slot: got CPU %v, want none", *got[0].CPUP50Ms)
	}
	rep := Report{BootSteps: map[string][]BootStep{"create": got, "restore": summarizeBoots(r.byKey["restore"])}}
	var b strings.Builder
	if err := writeBootSteps(&b, rep); err != nil {
		t.Fatal(err)
	}
	if i, j := strings.Index(b.String(), "\nrestore "), strings.Index(b.String(), "\nboot "); i < 0 || j < 0 || i > j {
		t.Errorf("want the restore step's row before boot's (it follows slot in its kind):\n%s", b.String())
	}
	for _, want := range []string{"create (3)", "restore (1)", "20.0 / 10.0", "1.0 / -", "5.0 / 4.0"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}
