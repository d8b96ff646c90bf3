package cli

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentenv/agentenv/internal/bench"
)

func benchCmd(g *globals) *cobra.Command {
	cfg := bench.Config{}
	var only, levels, rolloutLevels, plot string
	var serve, quick bool
	cmd := &cobra.Command{
		Use:   "bench [GROUP...]",
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
  cpu       CPU-ms per create, exec, kill, snapshot, restore, fork child and
            churn cycle, summed over every process of the target (server,
            workers, sandbox and gofer processes, nft, CLI calls): each
            target runs in a cgroup v2 of the bench's; median of --cpu-rounds
            batches of --cpu-n operations, idle use subtracted. agentenv's
            column needs --serve (the bench starts the server it measures)
  rollout   the RL rollout workload: N agents in parallel (--rollout-levels),
            each creating a sandbox, 8 steps of (write a file through envd,
            run a command, read its output), kill; every 4th rollout forks 4
            children at step 4 that finish the episode; rollouts/s, rollouts
            per core-second and step p50/p95, beside the same script over the
            raw runsc CLI; --plot FILE writes rollouts/s as an SVG
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
  rl        not in the default run (builds two templates on a fresh server:
            minutes): runCode("1 + 1") p50 / p95 and CPU per call through
            the proxy to a code-interpreter-v1 sandbox's port 49999; and
            SandboxFusion's POST /run_code (verl's payload, a short python
            program) at 1 and 16 in flight, calls/s and CPU per call, beside
            the program in a sandbox created and killed per call (runner
            template) and bare python3 on the host. With --serve the server
            runs --sandboxfusion-listen; else --sandboxfusion-url names it

crun has no pause, snapshot or fork: its column is empty there. Prints p50 /
p95 / max in ms (cycles/s for churn, MiB for memory, MiB/s for throughput)
and agentenv's value over each raw runtime's. --only (or the arguments) picks
groups, e.g. --only pause,snapshot, or ` + "`agentenv bench rollout`" + `.

--serve starts a server of this binary for the run (fresh data dir, free
loopback ports, --serve-network-cidr and -tag; --serve-flag adds serve flags)
and stops it at the end; without it the bench measures the server --server
names. --quick takes fewer samples (a few minutes in all).`,
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if serve {
				if cfg.Serve.Binary, err = os.Executable(); err != nil {
					return err
				}
			} else if cfg.Client, err = g.client(); err != nil {
				return err
			}
			groups := args
			if only != "" {
				groups = append(groups, only)
			}
			if cfg.Only, err = bench.ParseGroups(strings.Join(groups, ",")); err != nil {
				return err
			}
			if quick {
				quicken(cmd, &cfg, &levels, &rolloutLevels)
			}
			if cfg.RolloutLevels, err = bench.ParseLevels(rolloutLevels); err != nil {
				return fmt.Errorf("--rollout-levels: %w", err)
			}
			switch f := cmd.Flags(); {
			case f.Changed("churn-in-flight") && !f.Changed("churn-levels"):
				// The old way to ask for one level.
				cfg.ChurnLevels = []int{cfg.ChurnInFlight}
			default:
				if cfg.ChurnLevels, err = bench.ParseLevels(levels); err != nil {
					return fmt.Errorf("--churn-levels: %w", err)
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
			if plot != "" {
				if err := writePlot(plot, rep); err != nil {
					return err
				}
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
	f.IntVar(&cfg.CPURounds, "cpu-rounds", 3, "batches per target of each CPU row (the table shows their median)")
	f.IntVar(&cfg.CPUOps, "cpu-n", 8, "operations per batch of the CPU rows")
	f.StringVar(&rolloutLevels, "rollout-levels", "1,2,4,8,16", "agents in parallel: one rollout run per level and target")
	f.DurationVar(&cfg.RolloutDuration, "rollout-duration", 5*time.Second, "how long rollouts start per level and target")
	f.StringVar(&plot, "plot", "", "write rollouts/s by agents (agentenv and raw runsc) as an SVG to this file")
	f.BoolVar(&serve, "serve", false, "start a server of this binary for the run, in a cgroup of the bench's so its CPU is counted, and stop it at the end")
	f.StringVar(&cfg.Serve.NetworkCIDR, "serve-network-cidr", "10.226.0.0/20", "with --serve: the server's --network-cidr")
	f.StringVar(&cfg.Serve.NetworkTag, "serve-network-tag", "bnc", "with --serve: the server's --network-tag (its firewall table is removed at the end)")
	f.StringArrayVar(&cfg.Serve.Flags, "serve-flag", nil, "with --serve: a flag for agentenv serve, e.g. --serve-flag=--ready-templates (repeatable)")
	f.BoolVar(&quick, "quick", false, "fewer samples and shorter runs: -n 5 --heavy-n 2 --churn-duration 2s --churn-levels 1,8 --cpu-rounds 2 --cpu-n 4 --rollout-duration 2s --rollout-levels 1,8 (flags given win)")
	f.StringVar(&only, "only", "", "comma-separated groups to run (default all but density and rl): "+strings.Join(bench.Groups, ","))
	f.StringVar(&cfg.SandboxFusionURL, "sandboxfusion-url", "", "the rl group's SandboxFusion service (http://HOST:PORT) when the bench does not start the server (--serve)")
	f.StringVar(&cfg.HostPython, "host-python", "/usr/bin/python3", "the rl group's python3 on the host (the unsandboxed floor): the distribution's, not a version manager's shim")
	f.BoolVar(&cfg.SkipRaw, "skip-raw", false, "measure agentenv only (no runsc or crun; no root needed)")
	f.StringVar(&cfg.Runsc, "runsc", "runsc", "runsc binary for the raw comparison (the server's pinned build)")
	f.StringVar(&cfg.Crun, "crun", "crun", "crun binary for the raw comparison")
	f.StringVar(&cfg.Busybox, "busybox", "/bin/busybox", "static busybox the raw rootfs is made from")
	return cmd
}

// quicken lowers the sample counts and durations the user did not set.
func quicken(cmd *cobra.Command, cfg *bench.Config, churnLevels, rolloutLevels *string) {
	f := cmd.Flags()
	set := func(name string, apply func()) {
		if !f.Changed(name) {
			apply()
		}
	}
	set("iterations", func() { cfg.Iterations = 5 })
	set("heavy-n", func() { cfg.HeavyIterations = 2 })
	set("churn-duration", func() { cfg.ChurnDuration = 2 * time.Second })
	set("churn-levels", func() { *churnLevels = "1,8" })
	set("cpu-rounds", func() { cfg.CPURounds = 2 })
	set("cpu-n", func() { cfg.CPUOps = 4 })
	set("rollout-duration", func() { cfg.RolloutDuration = 2 * time.Second })
	set("rollout-levels", func() { *rolloutLevels = "1,8" })
}

// writePlot writes the rollout plot to path.
func writePlot(path string, rep bench.Report) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := bench.WriteRolloutSVG(f, rep); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	return f.Close()
}
