package cli

import (
	"fmt"
	"strconv"

	"github.com/spf13/cobra"
)

// sandboxStateCmds are the sandbox subcommands of the pause/snapshot/fork
// family.
func sandboxStateCmds(g *globals) []*cobra.Command {
	pause := &cobra.Command{
		Use: "pause ID", Short: "Freeze a sandbox (no CPU; its timeout stops)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			return c.PauseSandbox(cmd.Context(), args[0])
		},
	}
	resume := &cobra.Command{
		Use: "resume ID", Short: "Continue a paused sandbox", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			_, err = c.ResumeSandbox(cmd.Context(), args[0])
			return err
		},
	}
	var name string
	var meta []string
	snap := &cobra.Command{
		Use: "snapshot ID", Short: "Snapshot a running sandbox (it keeps running); prints the snapshot ID", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			md, err := parsePairs(meta, "--metadata")
			if err != nil {
				return err
			}
			sn, err := c.SnapshotSandbox(cmd.Context(), args[0], name, md)
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(cmd.OutOrStdout(), sn)
			}
			fmt.Fprintln(cmd.OutOrStdout(), sn.SnapshotID)
			return nil
		},
	}
	snap.Flags().StringVar(&name, "name", "", "snapshot name (`sandbox create NAME` restores it)")
	snap.Flags().StringArrayVarP(&meta, "metadata", "m", nil, "metadata KEY=VALUE (repeatable)")
	var n int
	fork := &cobra.Command{
		Use: "fork ID", Short: "Fork a running sandbox into N children; prints their IDs", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			sbs, errs, err := c.ForkSandbox(cmd.Context(), args[0], n)
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(cmd.OutOrStdout(), sbs)
			}
			failed := 0
			for i, sb := range sbs {
				if errs[i] != nil {
					failed++
					fmt.Fprintf(cmd.ErrOrStderr(), "child %d failed: %v\n", i, errs[i])
					continue
				}
				fmt.Fprintln(cmd.OutOrStdout(), sb.SandboxID)
			}
			if failed > 0 {
				return fmt.Errorf("%d of %d children failed", failed, len(sbs))
			}
			return nil
		},
	}
	fork.Flags().IntVarP(&n, "count", "n", 1, "number of children")
	return []*cobra.Command{pause, resume, snap, fork}
}

func snapshotCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "snapshot", Aliases: []string{"snap"}, Short: "List and delete snapshots (create sandboxes from them with `sandbox create SNAPSHOT_ID|NAME`)"}
	var sandboxID string
	list := &cobra.Command{
		Use: "list", Aliases: []string{"ls"}, Short: "List snapshots", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			sns, err := c.ListSnapshots(cmd.Context(), sandboxID)
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(cmd.OutOrStdout(), sns)
			}
			rows := [][]string{}
			for _, sn := range sns {
				rows = append(rows, []string{sn.SnapshotID, sn.Name, sn.TemplateID, sn.SandboxID, sn.Parent,
					fmt.Sprintf("%.1f MiB", float64(sn.SizeBytes)/(1<<20)), strconv.Itoa(sn.InUse), sn.CreatedAt.Local().Format("2006-01-02 15:04:05")})
			}
			table(cmd.OutOrStdout(), "ID\tNAME\tTEMPLATE\tSANDBOX\tPARENT\tSIZE\tIN USE\tCREATED", rows)
			return nil
		},
	}
	list.Flags().StringVar(&sandboxID, "sandbox", "", "only snapshots of this sandbox")
	del := &cobra.Command{
		Use: "delete ID...", Short: "Delete snapshots nothing needs", Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			for _, id := range args {
				if err := c.DeleteSnapshot(cmd.Context(), id); err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), "deleted", id)
			}
			return nil
		},
	}
	cmd.AddCommand(list, del)
	return cmd
}
