package bench

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
)

// The tables after the main one: churn at each level of parallelism,
// density, and the limits probe.

// others are the targets other than agentenv, in column order.
func others(rep Report) []string {
	var out []string
	for _, t := range rep.Targets {
		if t != TargetAgentenv {
			out = append(out, t)
		}
	}
	return out
}

// ratioHeader is the header of a table with a column per target and a
// ratio column per raw target.
func ratioHeader(first string, rep Report) string {
	h := append([]string{first}, rep.Targets...)
	for _, t := range others(rep) {
		h = append(h, TargetAgentenv+"/"+t)
	}
	return strings.Join(h, "\t")
}

func levelsString(levels []int) string {
	s := make([]string, len(levels))
	for i, l := range levels {
		s[i] = strconv.Itoa(l)
	}
	return strings.Join(s, ",")
}

// writeChurnLevels prints cycles/s per level (rows) and target (columns),
// with the host's CPU busy share during each run, and agentenv's rate over
// each raw target's.
func writeChurnLevels(w io.Writer, rep Report) error {
	if len(rep.ChurnByLevel) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\nchurn by parallelism: create+exec+kill cycles/s, %gs per level and target; host CPU busy (all processes, all cores) in parentheses\n", rep.ChurnSeconds)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, ratioHeader("in flight", rep))
	at := func(target string, level int) (Throughput, bool) {
		for _, th := range rep.ChurnByLevel[target] {
			if th.InFlight == level {
				return th, th.Cycles > 0
			}
		}
		return Throughput{}, false
	}
	for _, level := range rep.ChurnLevels {
		row := []string{strconv.Itoa(level)}
		for _, t := range rep.Targets {
			th, ok := at(t, level)
			if !ok {
				row = append(row, "-")
				continue
			}
			c := num(th.PerSecond) + "/s"
			if th.HostCPUBusy > 0 {
				c += fmt.Sprintf(" (%.0f%%)", 100*th.HostCPUBusy)
			}
			if th.Failed > 0 {
				c += fmt.Sprintf(" %d failed", th.Failed)
			}
			row = append(row, c)
		}
		base, baseOK := at(TargetAgentenv, level)
		for _, t := range others(rep) {
			th, ok := at(t, level)
			row = append(row, ratio(base.PerSecond, th.PerSecond, baseOK && ok))
		}
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	return tw.Flush()
}

// densityRows are the rows of the density table: a cell per run, and the
// number agentenv's ratio divides (ok false: no ratio for that row).
var densityRows = []struct {
	label string
	cell  func(DensityRun) string
	value func(DensityRun) (float64, bool)
}{
	{"sandboxes started", func(d DensityRun) string {
		s := fmt.Sprintf("%d of %d", d.Started, d.Requested)
		if d.FailedCreates > 0 {
			s += fmt.Sprintf(" (%d failed)", d.FailedCreates)
		}
		return s
	}, nil},
	{"time to start them all (s)", func(d DensityRun) string { return num(d.StartSeconds) },
		func(d DensityRun) (float64, bool) { return d.StartSeconds, d.Started > 0 }},
	{"create until a command runs (ms)", func(d DensityRun) string { return cell(d.Create) },
		func(d DensityRun) (float64, bool) { return d.Create.P50Ms, d.Create.N > 0 }},
	{"host memory used (MemAvailable drop, MiB)", func(d DensityRun) string { return num(d.MemAvailableDropMiB) }, nil},
	{"  per sandbox (MiB)", func(d DensityRun) string { return num(d.MiBPerSandbox()) },
		func(d DensityRun) (float64, bool) { return d.MiBPerSandbox(), d.Started > 0 }},
	{"host threads per sandbox", func(d DensityRun) string { return num(d.ThreadsPerSandbox) },
		func(d DensityRun) (float64, bool) { return d.ThreadsPerSandbox, d.ThreadsPerSandbox > 0 }},
	{"answered /bin/true with all up", func(d DensityRun) string { return fmt.Sprintf("%d of %d", d.Answered, d.Started) }, nil},
	{"  exec /bin/true with all up (ms)", func(d DensityRun) string { return cell(d.Exec) },
		func(d DensityRun) (float64, bool) { return d.Exec.P50Ms, d.Exec.N > 0 }},
	{"time to kill them all (s)", func(d DensityRun) string {
		s := num(d.KillSeconds)
		if d.KillFailed > 0 {
			s += fmt.Sprintf(" (%d failed)", d.KillFailed)
		}
		return s
	}, func(d DensityRun) (float64, bool) { return d.KillSeconds, d.Started > 0 }},
}

// writeDensity prints the density group: a row per measure, a column per
// target.
func writeDensity(w io.Writer, rep Report) error {
	if len(rep.DensityRuns) == 0 {
		return nil
	}
	var n, par int
	for _, d := range rep.DensityRuns {
		n, par = d.Requested, d.Parallel
	}
	fmt.Fprintf(w, "\ndensity: %d idle sandboxes per target (targets one after the other), %d creates at a time, then /bin/true in each; times in ms as p50 / p95 / max\n", n, par)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, ratioHeader("", rep))
	for _, r := range densityRows {
		row := []string{r.label}
		for _, t := range rep.Targets {
			d, ok := rep.DensityRuns[t]
			if !ok {
				row = append(row, "-")
				continue
			}
			row = append(row, r.cell(d))
		}
		for _, t := range others(rep) {
			if r.value == nil {
				row = append(row, "")
				continue
			}
			a, aok := rep.DensityRuns[TargetAgentenv]
			b, bok := rep.DensityRuns[t]
			av, aok2 := r.value(a)
			bv, bok2 := r.value(b)
			row = append(row, ratio(av, bv, aok && bok && aok2 && bok2))
		}
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	return tw.Flush()
}

// writeLimits prints the limits probe: each count with no sandboxes and
// with the density row's up, per sandbox, at ten times as many, the host's
// limit and the number of sandboxes at which it is reached.
func writeLimits(w io.Writer, rep Report) error {
	l := rep.Limits
	if l == nil {
		return nil
	}
	fmt.Fprintf(w, "\nwhat limits the next 10x (agentenv): counted with no sandboxes and with %d up, extrapolated linearly to %d; other jobs on the host count too\n", l.Sandboxes, 10*l.Sandboxes)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "what\t0\t%d\tper sandbox\t%d (10x)\tlimit\treached at\n", l.Sandboxes, 10*l.Sandboxes)
	label := map[string]string{}
	for _, r := range l.Rows {
		label[r.Key] = r.Label
		before, per, reached := num(r.Before), num(r.PerSandbox), "-"
		if r.PerProcess {
			before, per = "-", "-"
		}
		switch far := 100 * float64(l.Sandboxes); {
		case r.ReachedAt > far && far > 0:
			// A growth this small is within the noise of other jobs.
			reached = fmt.Sprintf("> %.0f", far)
		case r.ReachedAt > 0:
			reached = fmt.Sprintf("%.0f", r.ReachedAt)
		}
		limit := "-"
		if r.Limit > 0 {
			limit = fmt.Sprintf("%.0f %s", r.Limit, r.LimitName)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Label, before, num(r.After), per, num(r.At10x), limit, reached)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if l.First != "" {
		fmt.Fprintf(w, "first limit reached: %s, at about %.0f sandboxes\n", label[l.First], l.FirstReachedAt)
	}
	return nil
}
