package bench

import (
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
)

// writeRollout prints the rollout table: per level, each target's
// rollouts/s and rollouts per core-second with agentenv's over each other
// target's, then CPU per rollout and step latency; then the headline.
func writeRollout(w io.Writer, rep Report) error {
	ro := rep.Rollout
	if ro == nil || len(ro.ByTarget) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, rolloutDescription(ro))
	others := otherTargets(ro.Targets)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	header := []string{"agents"}
	for _, t := range ro.Targets {
		header = append(header, t+" /s")
	}
	header = append(header, ratioHeaders(ro.Targets, others)...)
	for _, t := range ro.Targets {
		header = append(header, t+" per core-s")
	}
	header = append(header, ratioHeaders(ro.Targets, others)...)
	for _, t := range ro.Targets {
		header = append(header, t+" CPU ms/rollout")
	}
	for _, t := range ro.Targets {
		header = append(header, t+" step p50 / p95 ms")
	}
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for i, agents := range ro.Levels {
		row := []string{fmt.Sprint(agents)}
		level := func(t string) (RolloutLevel, bool) {
			ls := ro.ByTarget[t]
			if i >= len(ls) {
				return RolloutLevel{}, false
			}
			return ls[i], true
		}
		rate := func(l RolloutLevel) float64 { return l.PerSecond }
		perCore := func(l RolloutLevel) float64 { return l.PerCoreSecond }
		for _, t := range ro.Targets {
			l, ok := level(t)
			row = append(row, orDash(ok, rateNum(l.PerSecond)+fmt.Sprintf(" (%.0f%%)", 100*l.HostCPUBusy)))
		}
		row = append(row, rolloutRatios(others, level, rate)...)
		for _, t := range ro.Targets {
			l, ok := level(t)
			row = append(row, orDash(ok && l.PerCoreSecond > 0, rateNum(l.PerCoreSecond)))
		}
		row = append(row, rolloutRatios(others, level, perCore)...)
		for _, t := range ro.Targets {
			l, ok := level(t)
			row = append(row, orDash(ok && l.CPUSeconds > 0, num(l.CPUMsPerRollout())))
		}
		for _, t := range ro.Targets {
			l, ok := level(t)
			row = append(row, orDash(ok && l.Step.N > 0, num(l.Step.P50Ms)+" / "+num(l.Step.P95Ms)))
		}
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "(in brackets: the host's CPU busy share over the level, every process)")
	if h := headlineLine(ro); h != "" {
		fmt.Fprintln(w, h)
	}
	return nil
}

// headlineLine is the one-line summary at the headline level.
func headlineLine(ro *RolloutReport) string {
	i := -1
	for j, l := range ro.Levels {
		if l == ro.Headline {
			i = j
		}
	}
	if i < 0 {
		return ""
	}
	var parts []string
	for _, t := range ro.Targets {
		ls := ro.ByTarget[t]
		if i >= len(ls) {
			continue
		}
		p := fmt.Sprintf("%s %s rollouts/s", t, rateNum(ls[i].PerSecond))
		if ls[i].PerCoreSecond > 0 {
			p += fmt.Sprintf(", %s per core-second", rateNum(ls[i].PerCoreSecond))
		}
		parts = append(parts, p)
	}
	return fmt.Sprintf("headline, %d agents: %s", ro.Headline, strings.Join(parts, "; "))
}

func otherTargets(ts []string) []string {
	var out []string
	for _, t := range ts {
		if t != TargetAgentenv {
			out = append(out, t)
		}
	}
	return out
}

func ratioHeaders(ts, others []string) []string {
	var out []string
	if len(ts) == len(others) {
		return nil // no agentenv column to compare
	}
	for _, t := range others {
		out = append(out, TargetAgentenv+"/"+t)
	}
	return out
}

func rolloutRatios(others []string, level func(string) (RolloutLevel, bool), v func(RolloutLevel) float64) []string {
	a, aok := level(TargetAgentenv)
	if !aok {
		return nil
	}
	var out []string
	for _, t := range others {
		o, ok := level(t)
		out = append(out, ratio(v(a), v(o), ok && v(a) > 0 && v(o) > 0))
	}
	return out
}

// rateNum shows rates below 10 with two decimals: rollouts come a few per
// second, and 0.4 against 0.9 hides a ratio.
func rateNum(v float64) string {
	if v > 0 && v < 10 {
		return fmt.Sprintf("%.2f", v)
	}
	return num(v)
}

func orDash(ok bool, s string) string {
	if !ok {
		return "-"
	}
	return s
}

// Colours of the plot's lines, by target.
var plotColours = map[string]string{TargetAgentenv: "#1f77b4", TargetRunsc: "#d62728", TargetCrun: "#2ca02c"}

// The plot's size and margins, in SVG user units.
const (
	plotW, plotH                             = 640, 400
	plotLeft, plotRight, plotTop, plotBottom = 64, 24, 48, 56
	plotPad                                  = 24
)

// WriteRolloutSVG draws rollouts/s against the number of agents (log
// scale), one line per target, as a standalone SVG document.
func WriteRolloutSVG(w io.Writer, rep Report) error {
	ro := rep.Rollout
	if ro == nil || len(ro.Levels) == 0 || len(ro.ByTarget) == 0 {
		return errors.New("no rollout results to plot: run the rollout group")
	}
	ymax := 0.0
	for _, ls := range ro.ByTarget {
		for _, l := range ls {
			ymax = math.Max(ymax, l.PerSecond)
		}
	}
	ymax = niceCeil(ymax * 1.1)
	lo, hi := math.Log2(float64(ro.Levels[0])), math.Log2(float64(ro.Levels[len(ro.Levels)-1]))
	// The points keep clear of the axes by plotPad.
	x := func(agents int) float64 {
		if hi == lo {
			return plotLeft + (plotW-plotLeft-plotRight)/2
		}
		return plotLeft + plotPad + (math.Log2(float64(agents))-lo)/(hi-lo)*(plotW-plotLeft-plotRight-2*plotPad)
	}
	y := func(v float64) float64 { return plotH - plotBottom - v/ymax*(plotH-plotTop-plotBottom) }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", plotW, plotH, plotW, plotH)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", plotW, plotH)
	fmt.Fprintf(&b, `<text x="%d" y="24" font-size="15">Rollouts per second by agents in parallel</text>`+"\n", plotLeft)
	for i := 0; i <= 5; i++ {
		v := ymax * float64(i) / 5
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", plotLeft, y(v), plotW-plotRight, y(v))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", plotLeft-6, y(v)+4, rateNum(v))
	}
	for _, a := range ro.Levels {
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%d</text>`+"\n", x(a), plotH-plotBottom+18, a)
	}
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", plotLeft, plotH-plotBottom, plotW-plotRight, plotH-plotBottom)
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", plotLeft, plotTop, plotLeft, plotH-plotBottom)
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">agents in parallel</text>`+"\n", (plotW+plotLeft-plotRight)/2, plotH-16)
	fmt.Fprintf(&b, `<text x="16" y="%d" text-anchor="middle" transform="rotate(-90 16 %d)">rollouts/s</text>`+"\n", (plotH+plotTop-plotBottom)/2, (plotH+plotTop-plotBottom)/2)
	for i, t := range ro.Targets {
		colour := plotColours[t]
		if colour == "" {
			colour = "#555"
		}
		var pts []string
		for j, l := range ro.ByTarget[t] {
			if j >= len(ro.Levels) {
				break
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(ro.Levels[j]), y(l.PerSecond)))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", colour, strings.Join(pts, " "))
		for j, l := range ro.ByTarget[t] {
			if j >= len(ro.Levels) {
				break
			}
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"><title>%s, %d agents: %s rollouts/s</title></circle>`+"\n",
				x(ro.Levels[j]), y(l.PerSecond), colour, xmlText(t), ro.Levels[j], rateNum(l.PerSecond))
		}
		ly := plotTop + 4 + 18*i
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"/>`+"\n", plotW-plotRight-150, ly, plotW-plotRight-126, ly, colour)
		label := t
		if t == TargetRunsc {
			label = "raw runsc CLI"
		}
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", plotW-plotRight-120, ly+4, xmlText(label))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

func xmlText(s string) string {
	r := strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;")
	return r.Replace(s)
}
