package client

import (
	"context"
	"errors"
	"fmt"
	"io"

	"connectrpc.com/connect"

	"github.com/agentenv/agentenv/client/api/envd/processpb"
	"github.com/agentenv/agentenv/client/api/envd/processpb/processpbconnect"
)

// PTYRequest describes a terminal session to start in a sandbox.
type PTYRequest struct {
	Cmd  string // default: /bin/bash, as E2B's SDK
	Args []string
	// Cols and Rows are the terminal's size (default 80x24).
	Cols, Rows uint32
	Envs       map[string]string
	Cwd        string
	User       string // empty: envd's default user
}

// PTY is a terminal session in a sandbox: a process whose stdin, stdout
// and stderr are a pseudo-terminal, driven through envd.
type PTY struct {
	PID    uint32
	pc     processpbconnect.ProcessClient
	stream *connect.ServerStreamForClient[processpb.StartResponse]
	sel    *processpb.ProcessSelector
}

// StartPTY starts a terminal session. It lives until its process ends or
// is killed: the request sets no timeout, and cancelling ctx only stops
// reading its output.
func (c *Client) StartPTY(ctx context.Context, sb Sandbox, r PTYRequest) (*PTY, error) {
	if r.Cmd == "" {
		r.Cmd, r.Args = "/bin/bash", []string{"-i", "-l"}
	}
	if r.Cols == 0 || r.Rows == 0 {
		r.Cols, r.Rows = 80, 24
	}
	hc, base := c.Envd(sb)
	pc := processpbconnect.NewProcessClient(hc, base)
	cfg := &processpb.ProcessConfig{Cmd: r.Cmd, Args: r.Args, Envs: r.Envs}
	if r.Cwd != "" {
		cfg.Cwd = &r.Cwd
	}
	req := connect.NewRequest(&processpb.StartRequest{
		Process: cfg,
		Pty:     &processpb.PTY{Size: &processpb.PTY_Size{Cols: r.Cols, Rows: r.Rows}},
	})
	basicUser(req.Header(), r.User)
	stream, err := pc.Start(ctx, req)
	if err != nil {
		return nil, c.explain(ctx, sb, err)
	}
	if !stream.Receive() {
		err := stream.Err()
		stream.Close()
		if err == nil {
			err = errors.New("the PTY stream ended before its start event")
		}
		return nil, c.explain(ctx, sb, err)
	}
	pid := stream.Msg().GetEvent().GetStart().GetPid()
	if pid == 0 {
		stream.Close()
		return nil, fmt.Errorf("got %v first, want the PTY's start event", stream.Msg().GetEvent())
	}
	return &PTY{PID: pid, pc: pc, stream: stream,
		sel: &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: pid}}}, nil
}

// Output copies the terminal's output to w until the process ends and
// returns its exit code (-1 when a signal ended it).
func (p *PTY) Output(w io.Writer) (int, error) {
	for p.stream.Receive() {
		ev := p.stream.Msg().GetEvent()
		if b := ev.GetData().GetPty(); len(b) > 0 {
			if _, err := w.Write(b); err != nil {
				return 0, err
			}
		}
		if end := ev.GetEnd(); end != nil {
			if end.GetError() != "" {
				return int(end.GetExitCode()), endError(end.GetError())
			}
			return int(end.GetExitCode()), nil
		}
	}
	if err := p.stream.Err(); err != nil {
		return 0, err
	}
	return 0, errors.New("the PTY stream ended without an exit code")
}

// Write types b into the terminal.
func (p *PTY) Write(ctx context.Context, b []byte) error {
	_, err := p.pc.SendInput(ctx, connect.NewRequest(&processpb.SendInputRequest{Process: p.sel,
		Input: &processpb.ProcessInput{Input: &processpb.ProcessInput_Pty{Pty: b}}}))
	return err
}

// Resize sets the terminal's size.
func (p *PTY) Resize(ctx context.Context, cols, rows uint32) error {
	_, err := p.pc.Update(ctx, connect.NewRequest(&processpb.UpdateRequest{Process: p.sel,
		Pty: &processpb.PTY{Size: &processpb.PTY_Size{Cols: cols, Rows: rows}}}))
	return err
}

// Kill ends the session's process with SIGKILL.
func (p *PTY) Kill(ctx context.Context) error {
	_, err := p.pc.SendSignal(ctx, connect.NewRequest(&processpb.SendSignalRequest{Process: p.sel,
		Signal: processpb.Signal_SIGNAL_SIGKILL}))
	return err
}

// Close stops reading the session's output; the process goes on.
func (p *PTY) Close() error { return p.stream.Close() }
