package cli

import (
	"context"
	"errors"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/agentenv/agentenv/client"
)

// sandboxShell opens an interactive terminal in a sandbox, like
// `e2b sandbox connect`: a login shell on a PTY, the local terminal in raw
// mode and its size followed. Without a local terminal (input piped), the
// shell reads the input and ends at its end.
func sandboxShell(g *globals) *cobra.Command {
	var user, cwd string
	cmd := &cobra.Command{
		Use:   "shell ID",
		Short: "Open an interactive terminal (bash on a PTY) in a sandbox",
		Long: "Opens a login shell on a pseudo-terminal in the sandbox and connects your terminal to it;\n" +
			"the shell's exit ends the command with its exit code. Input that is not a terminal is typed\n" +
			"into the shell, followed by Ctrl+D.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			sb, err := c.GetSandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			code, err := runShell(cmd.Context(), c, sb, client.PTYRequest{User: user, Cwd: cwd}, os.Stdin, cmd.OutOrStdout())
			if err != nil {
				return err
			}
			if code != 0 {
				return ExitError{Code: code}
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&user, "user", "u", "", "user to run the shell as (default: the sandbox's default user)")
	cmd.Flags().StringVar(&cwd, "cwd", "", "working directory (default: the user's home)")
	return cmd
}

// runShell starts a shell on a PTY and connects in and out to it until the
// shell ends.
func runShell(ctx context.Context, c *client.Client, sb client.Sandbox, req client.PTYRequest, in *os.File, out io.Writer) (int, error) {
	fd := int(in.Fd())
	tty := term.IsTerminal(fd)
	req.Envs = map[string]string{"TERM": "xterm-256color", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
	if tty {
		if t := os.Getenv("TERM"); t != "" {
			req.Envs["TERM"] = t
		}
		if w, h, err := term.GetSize(fd); err == nil && w > 0 && h > 0 {
			req.Cols, req.Rows = uint32(w), uint32(h)
		}
	}
	p, err := c.StartPTY(ctx, sb, req)
	if err != nil {
		return 0, err
	}
	defer p.Close()
	if tty {
		state, err := term.MakeRaw(fd)
		if err != nil {
			p.Kill(context.WithoutCancel(ctx))
			return 0, err
		}
		defer term.Restore(fd, state)
		stop := followSize(ctx, p, fd)
		defer stop()
	}
	go typeInput(ctx, p, in, !tty)
	return p.Output(out)
}

// typeInput sends what in yields to the PTY; at its end, when it is not a
// terminal, Ctrl+D, which ends a shell waiting at its prompt.
func typeInput(ctx context.Context, p *client.PTY, in io.Reader, eofIsCtrlD bool) {
	buf := make([]byte, 4096)
	for {
		n, err := in.Read(buf)
		if n > 0 {
			if werr := p.Write(ctx, buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) && eofIsCtrlD {
				p.Write(ctx, []byte{4})
			}
			return
		}
	}
}

// followSize resizes the PTY whenever the local terminal's size changes.
func followSize(ctx context.Context, p *client.PTY, fd int) (stop func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGWINCH)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-ch:
				if w, h, err := term.GetSize(fd); err == nil && w > 0 && h > 0 {
					p.Resize(ctx, uint32(w), uint32(h))
				}
			case <-done:
				return
			}
		}
	}()
	return func() {
		signal.Stop(ch)
		close(done)
	}
}
