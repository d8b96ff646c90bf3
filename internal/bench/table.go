package bench

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
)

// WriteTable prints rep as a table: per row, each target's value (times
// as p50 / p95 / max in ms, churn in cycles/s, memory in PSS MiB per
// sandbox, throughput in MiB/s), then agentenv's value divided by each raw
// target's. Rows no target measured are left out; "-" marks a target that
// has no such row.
func WriteTable(w io.Writer, rep Report) error {
	fmt.Fprintf(w, "template %s", rep.Template)
	if len(rep.Stats) > 0 {
		fmt.Fprintf(w, "; %d iterations", rep.Iterations)
		if rep.Warmup > 0 {
			fmt.Fprintf(w, " (after %d warm-up)", rep.Warmup)
		}
		if rep.HeavyIterations > 0 {
			fmt.Fprintf(w, ", %d for dirty snapshots and forks", rep.HeavyIterations)
		}
	}
	switch {
	case rep.Churn != nil && len(rep.ChurnLevels) > 1:
		fmt.Fprintf(w, "; churn at %s in flight for %gs per level and target (the churn row: %d in flight)", levelsString(rep.ChurnLevels), rep.ChurnSeconds, rep.ChurnInFlight)
	case rep.Churn != nil:
		fmt.Fprintf(w, "; churn %d in flight for %gs per target", rep.ChurnInFlight, rep.ChurnSeconds)
	}
	if rep.Memory != nil {
		fmt.Fprintf(w, "; memory with %d sandboxes", rep.Density)
	}
	if rep.Bandwidth != nil {
		fmt.Fprintf(w, "; throughput as the median of %d transfers of %d MiB", netTransfers, netMiB)
	}
	fmt.Fprintln(w)
	if err := writeMain(w, rep); err != nil {
		return err
	}
	for _, section := range []func(io.Writer, Report) error{writeBootSteps, writeChurnLevels, writeCPU, writeRollout, writeDensity, writeLimits, writeRL} {
		if err := section(w, rep); err != nil {
			return err
		}
	}
	for _, n := range rep.Notes {
		fmt.Fprintln(w, "  "+n)
	}
	return nil
}

// writeMain prints the main table, if any of its rows was measured.
func writeMain(w io.Writer, rep Report) error {
	if !slices.ContainsFunc(Operations, func(op Operation) bool { return measured(rep, op) }) {
		return nil
	}
	fmt.Fprintln(w, "times in ms as p50 / p95 / max; churn in cycles/s; memory in MiB PSS per sandbox (mean); stored MiB per snapshot as median (max); ratios compare p50s, rates and MiB")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	header := []string{"operation"}
	header = append(header, rep.Targets...)
	var others []string
	for _, t := range rep.Targets {
		if t != TargetAgentenv {
			others = append(others, t)
			header = append(header, TargetAgentenv+"/"+t)
		}
	}
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, op := range Operations {
		if !measured(rep, op) {
			continue
		}
		row := []string{rowLabel(rep, op)}
		for _, t := range rep.Targets {
			_, ok := value(rep, t, op)
			row = append(row, cellOf(rep, t, op, ok))
		}
		base, baseOK := value(rep, TargetAgentenv, op)
		for _, t := range others {
			v, ok := value(rep, t, op)
			row = append(row, ratio(base, v, baseOK && ok))
		}
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	return tw.Flush()
}

// rowLabel is op's label, except that the create row says which path the
// server took.
func rowLabel(rep Report, op Operation) string {
	if op == OpCreate && rep.ReadyTemplate {
		return "create (ready template) until a command runs"
	}
	return op.Label()
}

// value is the number a row's ratio compares: p50 for times, cycles/s for
// churn, mean MiB for memory. ok is false when the target has no value.
func value(rep Report, target string, op Operation) (float64, bool) {
	switch op.Kind() {
	case KindRate:
		th, ok := rep.Churn[target]
		return th.PerSecond, ok && th.Cycles > 0
	case KindMemory:
		m, ok := rep.Memory[target][op]
		return m.PssMiB, ok && m.Sandboxes > 0
	case KindBandwidth:
		b, ok := rep.Bandwidth[target][op]
		return b.MedianMiBps, ok && b.N > 0
	case KindStorage:
		st, ok := rep.Storage[target][op]
		return st.MedianMiB, ok && st.N > 0
	default:
		s, ok := rep.Stats[target][op]
		return s.P50Ms, ok && s.N > 0
	}
}

func measured(rep Report, op Operation) bool {
	for _, t := range rep.Targets {
		if _, ok := value(rep, t, op); ok {
			return true
		}
	}
	return false
}

func cellOf(rep Report, target string, op Operation, ok bool) string {
	if !ok {
		return "-"
	}
	switch op.Kind() {
	case KindRate:
		return num(rep.Churn[target].PerSecond) + "/s"
	case KindMemory:
		return num(rep.Memory[target][op].PssMiB)
	case KindBandwidth:
		return num(rep.Bandwidth[target][op].MedianMiBps)
	case KindStorage:
		st := rep.Storage[target][op]
		return num(st.MedianMiB) + " (max " + num(st.MaxMiB) + ")"
	default:
		return cell(rep.Stats[target][op])
	}
}

func cell(s Stats) string {
	if s.N == 0 {
		return "-"
	}
	return fmt.Sprintf("%s / %s / %s", num(s.P50Ms), num(s.P95Ms), num(s.MaxMs))
}

func ratio(a, b float64, ok bool) string {
	if !ok || b == 0 {
		return "-"
	}
	if r := a / b; r > 0 && r < 0.1 {
		return fmt.Sprintf("%.2fx", r) // 0.04x, not 0.0x
	}
	return fmt.Sprintf("%.1fx", a/b)
}

// num keeps three significant digits or so: sub-millisecond times need
// the decimals, times of hundreds of ms do not.
func num(v float64) string {
	if v != 0 && v > -0.1 && v < 0.1 {
		return fmt.Sprintf("%.3f", v)
	}
	if v >= 100 || v <= -100 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}
