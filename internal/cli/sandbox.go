package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/agentenv/agentenv/client"
)

func sandboxCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "sandbox", Aliases: []string{"sb"}, Short: "Create, inspect, use and kill sandboxes"}
	cmd.AddCommand(sandboxCreate(g), sandboxList(g), sandboxGet(g), sandboxExec(g), sandboxShell(g), sandboxCp(g), sandboxKill(g))
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
			sb.StartedAt.Local().Format(time.DateTime), time.Until(sb.EndAt).Round(time.Second).String(),
			orDash(sb.SnapshotID), orDash(sb.ParentSandboxID), strings.Join(md, ",")})
	}
	return rows
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// SNAPSHOT and PARENT are a sandbox's lineage: the snapshot it was
// restored from and the sandbox that snapshot was taken of (a fork's
// parent).
const sandboxHeader = "ID\tTEMPLATE\tSTATE\tSTARTED\tREMAINING\tSNAPSHOT\tPARENT\tMETADATA"

func sandboxCreate(g *globals) *cobra.Command {
	var req client.CreateRequest
	var timeout int64
	var env, meta []string
	cmd := &cobra.Command{
		Use:   "create TEMPLATE|SNAPSHOT_ID|SNAPSHOT_NAME",
		Short: "Create a sandbox from a template (or restore a snapshot, by ID or name) and print its ID",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			req.TemplateID = args[0]
			if timeout != 0 { // 0: the server's default
				req.Timeout = &timeout
			}
			if req.EnvVars, err = parsePairs(env, "--env"); err != nil {
				return err
			}
			if req.Metadata, err = parsePairs(meta, "--metadata"); err != nil {
				return err
			}
			sb, err := createSandbox(cmd.Context(), c, req)
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
	f.Int64Var(&timeout, "timeout", 0, "seconds until the sandbox is killed (default 300)")
	f.IntVar(&req.CPUCount, "cpus", 0, "CPU limit (default: the template's, else the server's --default-cpus)")
	f.IntVar(&req.MemoryMB, "memory-mb", 0, "memory limit in MiB (default: the template's, else the server's --default-memory-mb)")
	f.StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	f.StringArrayVarP(&meta, "metadata", "m", nil, "metadata KEY=VALUE (repeatable)")
	return cmd
}

// createSandbox creates a sandbox from the template or snapshot (ID) that
// req names, or else from the snapshot of that name.
func createSandbox(ctx context.Context, c *client.Client, req client.CreateRequest) (client.Sandbox, error) {
	sb, err := c.CreateSandbox(ctx, req)
	var ae *client.Error
	if !errors.As(err, &ae) || ae.Status != http.StatusNotFound {
		return sb, err
	}
	sn, ok, serr := c.SnapshotByName(ctx, req.TemplateID)
	if serr != nil {
		return sb, serr
	}
	if !ok {
		return sb, &client.Error{Status: ae.Status, ErrorCode: ae.ErrorCode,
			Message: fmt.Sprintf("no template, snapshot ID or snapshot name %q (see `agentenv template list` and `agentenv snapshot list`)", req.TemplateID)}
	}
	req.TemplateID = sn.SnapshotID
	return c.CreateSandbox(ctx, req)
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
	var req client.ProcessRequest
	var env []string
	var stdin bool
	cmd := &cobra.Command{
		Use:   "exec [flags] ID [--] COMMAND [ARGS...]",
		Short: "Run a command in a sandbox; exits with the command's exit code",
		Long: "Runs COMMAND in the sandbox through envd, streaming its stdout and stderr, and input that is\n" +
			"not a terminal to its stdin (then end-of-file). With one argument, COMMAND is run by\n" +
			"`/bin/bash -l -c` (like the E2B SDK); with more, it is run directly. Flags after the ID are\n" +
			"agentenv's: put a command with flags of its own after `--`. Ctrl-C kills the command in the\n" +
			"sandbox and exits with status 130; a command killed at its --timeout exits with 124, and one\n" +
			"killed because the sandbox ran out of memory with 137 (the sandbox lives on).",
		Example:     "  agentenv sandbox exec ID 'echo hi; exit 3'\n  echo 'print(1)' | agentenv sandbox exec ID python3 -\n  agentenv sandbox exec --cwd /tmp -e A=1 ID -- ls -la",
		Args:        cobra.MinimumNArgs(2),
		Annotations: map[string]string{passesCommand: "1"},
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			if req.Envs, err = parsePairs(env, "--env"); err != nil {
				return err
			}
			if req.Timeout < 0 {
				return &usageError{err: fmt.Errorf("--timeout %s: give a positive duration, or 0 for none", req.Timeout), cmd: cmd}
			}
			sb, err := c.GetSandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			req.Cmd, req.Args = "/bin/bash", []string{"-l", "-c", args[1]}
			if len(args) > 2 {
				req.Cmd, req.Args = args[1], args[2:]
			}
			req.Stdin = stdin
			if !cmd.Flags().Changed("stdin") {
				req.Stdin = !term.IsTerminal(int(os.Stdin.Fd()))
			}
			code, err := runExec(cmd.Context(), c, sb, req, os.Stdin, cmd.OutOrStdout(), cmd.ErrOrStderr())
			switch {
			case errors.Is(err, client.ErrProcessTimeout):
				printError(cmd.ErrOrStderr(), err)
				return ExitError{Code: 124}
			case errors.Is(err, client.ErrOutOfMemory):
				// Killed (SIGKILL) as a shell reports it; the sandbox lives.
				printError(cmd.ErrOrStderr(), err)
				return ExitError{Code: max(code, 137)}
			}
			if err != nil {
				return err
			}
			if code != 0 {
				return ExitError{Code: code}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.Cwd, "cwd", "", "working directory (default: the user's home, or the template's workdir)")
	f.StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	f.StringVarP(&req.User, "user", "u", "", "user to run the command as (default: the sandbox's default user)")
	f.Var((*seconds)(&req.Timeout), "timeout", "kill the command after this long: seconds, or a duration such as 90s or 5m (0: no limit)")
	f.BoolVarP(&stdin, "stdin", "i", false, "send this terminal's input to the command (input that is not a terminal is sent unless --stdin=false)")
	return cmd
}

// seconds is a duration flag that also takes a plain number of seconds,
// as create's --timeout does.
type seconds time.Duration

func (s *seconds) String() string { return time.Duration(*s).String() }
func (s *seconds) Type() string   { return "duration" }

func (s *seconds) Set(v string) error {
	if n, err := strconv.ParseFloat(v, 64); err == nil {
		*s = seconds(time.Duration(n * float64(time.Second)))
		return nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return fmt.Errorf("give seconds (30) or a duration (90s, 5m)")
	}
	*s = seconds(d)
	return nil
}

// interrupted is the exit status after Ctrl-C (or SIGTERM) ended a command.
const interrupted = 130

// runExec runs req in sb until it ends, streaming in to its stdin (when
// req.Stdin) and its output to stdout and stderr, and returns its exit
// code. When ctx ends first (Ctrl-C, SIGTERM), the command is killed in
// the sandbox, not left running there, and the code is 130.
func runExec(ctx context.Context, c *client.Client, sb client.Sandbox, req client.ProcessRequest, in io.Reader, stdout, stderr io.Writer) (int, error) {
	// The command's stream outlives ctx: it carries the end event of the
	// kill below.
	bg := context.WithoutCancel(ctx)
	p, err := c.StartProcess(bg, sb, req)
	if err != nil {
		return 0, err
	}
	if req.Stdin {
		// Errors are the command's end (it stopped reading) or will show
		// as its own failure.
		go p.CopyStdin(bg, in)
	}
	type result struct {
		res client.ExecResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := p.Wait(stdout, stderr)
		done <- result{res, err}
	}()
	select {
	case r := <-done:
		return r.res.ExitCode, r.err
	case <-ctx.Done():
	}
	kctx, cancel := context.WithTimeout(bg, 10*time.Second)
	defer cancel()
	// SIGTERM lets the command clean up; SIGKILL after a grace period.
	p.Terminate(kctx)
	select {
	case <-done:
		return interrupted, nil
	case <-time.After(2 * time.Second):
	}
	if err := p.Kill(kctx); err != nil {
		return interrupted, fmt.Errorf("interrupted, and could not kill the command (PID %d) in sandbox %s: %w", p.PID, sb.SandboxID, err)
	}
	select {
	case <-done:
	case <-kctx.Done():
	}
	return interrupted, nil
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
