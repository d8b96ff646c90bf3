package cli

import (
	"io"

	"github.com/spf13/cobra"

	"agentenv/internal/bench"
)

func benchCmd(g *globals) *cobra.Command {
	cfg := bench.Config{}
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure sandbox operations against raw runsc and crun",
		Long: `Measure, against the running server: create until a command runs, exec
round trip, 1 MiB file write + read, and kill; and the same work done with the
raw runsc CLI and with crun in the same run (needs root; --skip-raw to skip).
Prints p50 / p95 / max in ms and agentenv's p50 over each raw runtime's.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			cfg.Client = c
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
	f.IntVarP(&cfg.Iterations, "iterations", "n", 20, "measured cycles per target")
	f.IntVar(&cfg.Warmup, "warmup", 1, "unmeasured cycles per target before measuring")
	f.BoolVar(&cfg.SkipRaw, "skip-raw", false, "measure agentenv only (no runsc or crun; no root needed)")
	f.StringVar(&cfg.Runsc, "runsc", "runsc", "runsc binary for the raw comparison (the server's pinned build)")
	f.StringVar(&cfg.Crun, "crun", "crun", "crun binary for the raw comparison")
	f.StringVar(&cfg.Busybox, "busybox", "/bin/busybox", "static busybox the raw rootfs is made from")
	return cmd
}
