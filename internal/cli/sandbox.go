package cli

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"agentenv/internal/client"
)

func sandboxCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "sandbox", Aliases: []string{"sb"}, Short: "Create, inspect, use and kill sandboxes"}
	cmd.AddCommand(sandboxCreate(g), sandboxList(g), sandboxGet(g), sandboxExec(g), sandboxShell(g), sandboxKill(g))
	cmd.AddCommand(sandboxStateCmds(g)...)
	return cmd
}

func parsePairs(kvs []string, what string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	out := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%s %q: write KEY=VALUE", what, kv)
		}
		out[k] = v
	}
	return out, nil
}

func sandboxRows(sbs []client.Sandbox) [][]string {
	rows := make([][]string, 0, len(sbs))
	for _, sb := range sbs {
		md := []string{}
		for k, v := range sb.Metadata {
			md = append(md, k+"="+v)
		}
		rows = append(rows, []string{sb.SandboxID, sb.TemplateID, sb.State,
			sb.StartedAt.Local().Format(time.DateTime), time.Until(sb.EndAt).Round(time.Second).String(), strings.Join(md, ",")})
	}
	return rows
}

const sandboxHeader = "ID\tTEMPLATE\tSTATE\tSTARTED\tREMAINING\tMETADATA"

func sandboxCreate(g *globals) *cobra.Command {
	var req client.CreateRequest
	var env, meta []string
	cmd := &cobra.Command{
		Use:   "create TEMPLATE|SNAPSHOT_ID",
		Short: "Create a sandbox from a template (or restore a snapshot) and print its ID",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			req.TemplateID = args[0]
			if req.EnvVars, err = parsePairs(env, "--env"); err != nil {
				return err
			}
			if req.Metadata, err = parsePairs(meta, "--metadata"); err != nil {
				return err
			}
			sb, err := c.CreateSandbox(cmd.Context(), req)
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(cmd.OutOrStdout(), sb)
			}
			fmt.Fprintln(cmd.OutOrStdout(), sb.SandboxID)
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&req.Timeout, "timeout", 0, "seconds until the sandbox is killed (default 300)")
	f.IntVar(&req.CPUCount, "cpus", 0, "CPU limit")
	f.IntVar(&req.MemoryMB, "memory-mb", 0, "memory limit in MiB")
	f.StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	f.StringArrayVarP(&meta, "metadata", "m", nil, "metadata KEY=VALUE (repeatable)")
	return cmd
}

func sandboxList(g *globals) *cobra.Command {
	var meta []string
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List running sandboxes",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			md, err := parsePairs(meta, "--metadata")
			if err != nil {
				return err
			}
			sbs, err := c.ListSandboxes(cmd.Context(), md)
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(cmd.OutOrStdout(), sbs)
			}
			table(cmd.OutOrStdout(), sandboxHeader, sandboxRows(sbs))
			return nil
		},
	}
	cmd.Flags().StringArrayVarP(&meta, "metadata", "m", nil, "only sandboxes with this metadata KEY=VALUE (repeatable)")
	return cmd
}

func sandboxGet(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "get ID",
		Short: "Show one sandbox",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			sb, err := c.GetSandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if g.json {
				sb.EnvdAccessToken = ""
				return g.printJSON(cmd.OutOrStdout(), sb)
			}
			table(cmd.OutOrStdout(), sandboxHeader, sandboxRows([]client.Sandbox{sb}))
			return nil
		},
	}
}

func sandboxExec(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "exec ID -- COMMAND [ARGS...]",
		Short: "Run a command in a sandbox; exits with the command's exit code",
		Long: "Runs COMMAND in the sandbox through envd, streaming its stdout and stderr.\n" +
			"With one argument, COMMAND is run by `/bin/bash -l -c` (like the E2B SDK); with more, it is run directly.",
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			sb, err := c.GetSandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			prog, pargs := "/bin/bash", []string{"-l", "-c", args[1]}
			if len(args) > 2 {
				prog, pargs = args[1], args[2:]
			}
			res, err := c.Exec(cmd.Context(), sb, prog, pargs, os.Stdout, os.Stderr)
			if err != nil {
				return err
			}
			if res.ExitCode != 0 {
				return ExitError{Code: res.ExitCode}
			}
			return nil
		},
	}
	return cmd
}

func sandboxKill(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "kill ID...",
		Short: "Kill sandboxes",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			for _, id := range args {
				if err := c.KillSandbox(cmd.Context(), id); err != nil {
					return err
				}
				if !g.json {
					fmt.Fprintln(cmd.OutOrStdout(), "killed", id)
				}
			}
			return nil
		},
	}
}
