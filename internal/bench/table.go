package bench

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// WriteTable prints rep as a table: per operation, p50 / p95 / max in ms
// for each target, then agentenv's p50 divided by each raw target's p50.
func WriteTable(w io.Writer, rep Report) error {
	fmt.Fprintf(w, "template %s, %d iterations", rep.Template, rep.Iterations)
	if rep.Warmup > 0 {
		fmt.Fprintf(w, " (after %d warm-up)", rep.Warmup)
	}
	fmt.Fprintln(w, "; times in ms as p50 / p95 / max; ratios compare p50")
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
		row := []string{op.Label()}
		for _, t := range rep.Targets {
			row = append(row, cell(rep.Stats[t][op]))
		}
		base := rep.Stats[TargetAgentenv][op]
		for _, t := range others {
			row = append(row, ratio(base, rep.Stats[t][op]))
		}
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, n := range rep.Notes {
		fmt.Fprintln(w, "  "+n)
	}
	return nil
}

func cell(s Stats) string {
	if s.N == 0 {
		return "-"
	}
	return fmt.Sprintf("%s / %s / %s", num(s.P50Ms), num(s.P95Ms), num(s.MaxMs))
}

func ratio(a, b Stats) string {
	if a.N == 0 || b.N == 0 || b.P50Ms == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1fx", a.P50Ms/b.P50Ms)
}

// num keeps three significant digits or so: sub-millisecond times need
// the decimals, times of hundreds of ms do not.
func num(v float64) string {
	if v >= 100 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}
