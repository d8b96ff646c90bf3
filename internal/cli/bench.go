package cli

import (
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"agentenv/internal/bench"
)

func benchCmd(g *globals) *cobra.Command {
	cfg := bench.Config{}
	var only, levels string
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure sandbox operations against raw runsc and crun",
		Long: `Measure, against the running server, and beside the same work done with the
raw runsc CLI and with crun in the same run (needs root; --skip-raw to skip):

  basic     create until a command runs (boot, or restore of a ready template),
            exec, 1 MiB write + read, kill
  pause     pause, resume
  snapshot  snapshot of an idle sandbox
  restore   create from a snapshot until a command runs
  fork      fork 4 and fork 16 until every child has run a command
  dirty     snapshots with 64 and 256 MiB of dirty memory
  memory    PSS per idle sandbox and per fork child (needs root)
  churn     create+exec+kill cycles per second at 1, 2, 4, 8 and 16 in flight
            (--churn-levels), with the host's CPU busy share at each
  network   agentenv only: small GET to httpd in a sandbox through the proxy,
            64 MiB down from it and up to envd (MiB/s, median of 3)
  disk      256 MiB written (dd) into a sandbox's write layer, and into a raw
            runsc container with the same layer (MiB/s, median of 3)
  density   not in the default run (minutes): 1,000 idle sandboxes per target
            (--density-sandboxes), started 4 at a time: time to start them,
            host memory (MemAvailable drop), whether each still runs a
            command; then, with agentenv's up, a probe of what limits 10x as
            many (threads, open files, memory maps, nftables, the neighbour
            table, namespaces, cgroups, mounts, memory), extrapolated from
            the counts at 0 and N

crun has no pause, snapshot or fork: its column is empty there. Prints p50 /
p95 / max in ms (cycles/s for churn, MiB for memory, MiB/s for throughput)
and agentenv's value over each raw runtime's. --only picks groups, e.g. --only pause,snapshot
or --only density.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			cfg.Client = c
			if cfg.Only, err = bench.ParseGroups(only); err != nil {
				return err
			}
			switch f := cmd.Flags(); {
			case f.Changed("churn-in-flight") && !f.Changed("churn-levels"):
				// The old way to ask for one level.
				cfg.ChurnLevels = []int{cfg.ChurnInFlight}
			default:
				if cfg.ChurnLevels, err = bench.ParseLevels(levels); err != nil {
					return err
				}
			}
			cfg.Progress = cmd.ErrOrStderr()
			var out io.Writer = cmd.OutOrStdout()
			if g.json {
				out = io.Discard
			}
			rep, err := bench.Run(cmd.Context(), cfg, out)
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(cmd.OutOrStdout(), rep)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Template, "template", "busybox", "agentenv template to create sandboxes from")
	f.IntVarP(&cfg.Iterations, "iterations", "n", 20, "measured samples per target of the light rows (create/exec/file/kill, pause/resume, idle snapshot, restore)")
	f.IntVar(&cfg.Warmup, "warmup", 1, "unmeasured samples per target of the light rows before measuring")
	f.IntVar(&cfg.HeavyIterations, "heavy-n", 5, "measured samples per target of the heavy rows (dirty snapshots, fork 4, fork 16)")
	f.DurationVar(&cfg.ChurnDuration, "churn-duration", 5*time.Second, "how long churn runs per level and target")
	f.StringVar(&levels, "churn-levels", "1,2,4,8,16", "churn cycles kept going at once: one churn run per level and target")
	f.IntVar(&cfg.ChurnInFlight, "churn-in-flight", 8, "the level the main table's churn row shows; given without --churn-levels, churn runs at this level only")
	f.IntVar(&cfg.Density, "density", 10, "idle sandboxes, and fork children, running at once for the memory rows")
	f.IntVar(&cfg.DensitySandboxes, "density-sandboxes", 1000, "idle sandboxes the density group starts per target")
	f.IntVar(&cfg.DensityParallel, "density-parallel", 4, "creates in flight at once while the density group starts its sandboxes")
	f.StringVar(&only, "only", "", "comma-separated groups to run (default all): "+strings.Join(bench.Groups, ","))
	f.BoolVar(&cfg.SkipRaw, "skip-raw", false, "measure agentenv only (no runsc or crun; no root needed)")
	f.StringVar(&cfg.Runsc, "runsc", "runsc", "runsc binary for the raw comparison (the server's pinned build)")
	f.StringVar(&cfg.Crun, "crun", "crun", "crun binary for the raw comparison")
	f.StringVar(&cfg.Busybox, "busybox", "/bin/busybox", "static busybox the raw rootfs is made from")
	return cmd
}
