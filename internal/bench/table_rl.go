package bench

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// writeRL prints the rl group's tables: runCode's latency and CPU, then,
// per level, each way's calls per second and CPU per call.
func writeRL(w io.Writer, rep Report) error {
	rl := rep.RL
	if rl == nil {
		return nil
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "E2B code interpreter: runCode(\"1 + 1\") on one %s sandbox, POST /execute to port %d through the proxy; ms as p50 / p95 / max; CPU ms per call of the server's cgroup, median of %d batches (min–max) [wall ms]\n", codeInterpTemplate, codeInterpPort, rep.CPURounds)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "operation\tagentenv\tCPU ms per call")
	cpu := "-"
	if len(rl.RunCodeCPU.BatchesMs) > 0 {
		cpu = cpuCell(rl.RunCodeCPU)
	}
	fmt.Fprintf(tw, "runCode 1 + 1\t%s\t%s\n", cell(rl.RunCode), cpu)
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(rl.Calls) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "SandboxFusion: python %s in verl's /run_code payload; calls/s over the median batch; CPU ms per call, median of %d batches (min–max): agentenv's over the server's cgroup (sandboxes included), the host's from each process's rusage\n", rlCode, rep.CPURounds)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	header := []string{"way"}
	for _, l := range rlLevels {
		header = append(header, fmt.Sprintf("calls/s, %d in flight", l), fmt.Sprintf("CPU ms/call, %d in flight", l))
	}
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, way := range rlWays {
		rates := rl.Calls[way.key]
		if len(rates) == 0 {
			continue
		}
		cells := []string{way.label}
		for _, c := range rates {
			cpu := "-"
			if c.CPUCounted && len(c.CPU.BatchesMs) > 0 {
				cpu = num(c.CPU.MedianMs)
				if len(c.CPU.BatchesMs) > 1 {
					cpu += " (" + num(c.CPU.MinMs) + "–" + num(c.CPU.MaxMs) + ")"
				}
			}
			cells = append(cells, num(c.PerSecond()), cpu)
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if rl.CodeInterpreterBuildSeconds > 0 || rl.RunnerWaitSeconds > 0 {
		fmt.Fprintf(w, "  templates: %s built in %.0f s; then %.0f s more until the SandboxFusion service (its runner template %q built in the background) ran a call\n", codeInterpTemplate, rl.CodeInterpreterBuildSeconds, rl.RunnerWaitSeconds, runnerTemplate)
	}
	return nil
}
