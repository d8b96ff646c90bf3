package bench

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/agentenv/agentenv/client"
)

// The boot breakdown: the server returns with each create (and restore)
// where its boot spent its time, step by step (the sandbox's boot record).
// The basic and restore groups keep those records, and the report shows
// per boot kind the p50 of each step's wall time and of the CPU the
// sandbox's own processes used in it.

// BootStep summarises one step of one kind of boot over the creates the
// run measured.
type BootStep struct {
	Step string `json:"step"`
	// N is how many boots had the step.
	N         int     `json:"n"`
	WallP50Ms float64 `json:"wall_p50_ms"`
	// CPUP50Ms is nil when no boot reported the step's CPU.
	CPUP50Ms *float64 `json:"cpu_p50_ms,omitempty"`
}

// bootRecorder keeps the boot records of the creates made while it is on.
type bootRecorder struct {
	on    bool
	byKey map[string][]client.BootRecord
}

// add keeps rec (under the target's lock).
func (b *bootRecorder) add(rec *client.BootRecord) {
	if !b.on || rec == nil {
		return
	}
	if b.byKey == nil {
		b.byKey = map[string][]client.BootRecord{}
	}
	b.byKey[rec.Kind] = append(b.byKey[rec.Kind], *rec)
}

// recordBoots turns keeping boot records on or off.
func (t *agentenvTarget) recordBoots(on bool) {
	t.mu.Lock()
	t.boots.on = on
	t.mu.Unlock()
}

// bootSteps summarises the kept records: per kind, its steps in the order
// they ran.
func (t *agentenvTarget) bootSteps() map[string][]BootStep {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.boots.byKey) == 0 {
		return nil
	}
	out := map[string][]BootStep{}
	for kind, recs := range t.boots.byKey {
		out[kind] = summarizeBoots(recs)
	}
	return out
}

func summarizeBoots(recs []client.BootRecord) []BootStep {
	var order []string
	wall := map[string][]time.Duration{}
	cpu := map[string][]time.Duration{}
	for _, r := range recs {
		for _, s := range r.Steps {
			if _, seen := wall[s.Step]; !seen {
				order = append(order, s.Step)
			}
			wall[s.Step] = append(wall[s.Step], fromMs(s.WallMs))
			if s.CPUMs != nil {
				cpu[s.Step] = append(cpu[s.Step], fromMs(*s.CPUMs))
			}
		}
	}
	out := make([]BootStep, 0, len(order))
	for _, name := range order {
		bs := BootStep{Step: name, N: len(wall[name]), WallP50Ms: Summarize(wall[name]).P50Ms}
		if c := cpu[name]; len(c) > 0 {
			p := Summarize(c).P50Ms
			bs.CPUP50Ms = &p
		}
		out = append(out, bs)
	}
	return out
}

func fromMs(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }

// writeBootSteps prints the boot breakdown, one column pair per kind.
func writeBootSteps(w io.Writer, rep Report) error {
	if len(rep.BootSteps) == 0 {
		return nil
	}
	kinds := make([]string, 0, len(rep.BootSteps))
	for k := range rep.BootSteps {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	fmt.Fprintln(w)
	fmt.Fprintln(w, "agentenv boot steps, p50 in ms: wall / CPU of the sandbox's own processes (- where not known); a sum of p50s is not the p50 of the sum")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	header := []string{"step"}
	// Rows in the order the steps run: a step one kind has alone goes
	// after the step that precedes it there.
	var steps []string
	for _, k := range kinds {
		n, at := 0, 0
		for _, s := range rep.BootSteps[k] {
			n = max(n, s.N)
			if i := slices.Index(steps, s.Step); i >= 0 {
				at = i + 1
				continue
			}
			steps = slices.Insert(steps, at, s.Step)
			at++
		}
		header = append(header, fmt.Sprintf("%s (%d)", k, n))
	}
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, name := range steps {
		row := []string{name}
		for _, k := range kinds {
			i := slices.IndexFunc(rep.BootSteps[k], func(s BootStep) bool { return s.Step == name })
			if i < 0 {
				row = append(row, "")
				continue
			}
			s := rep.BootSteps[k][i]
			c := "-"
			if s.CPUP50Ms != nil {
				c = num(*s.CPUP50Ms)
			}
			row = append(row, num(s.WallP50Ms)+" / "+c)
		}
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	return tw.Flush()
}
