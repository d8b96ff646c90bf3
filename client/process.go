package client

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"time"

	"connectrpc.com/connect"

	"github.com/agentenv/agentenv/internal/envd/gen/processpb"
	"github.com/agentenv/agentenv/internal/envd/gen/processpb/processpbconnect"
)

// ProcessRequest describes a command to start in a sandbox.
type ProcessRequest struct {
	Cmd  string
	Args []string
	Envs map[string]string
	Cwd  string // empty: the user's home (or the template's workdir)
	User string // empty: envd's default user
	// Stdin keeps the process's stdin open for CopyStdin; without it the
	// process reads end-of-file at once.
	Stdin bool
	// Timeout, when positive, is the command's lifetime: envd kills it
	// then, even if this client has gone away.
	Timeout time.Duration
}

// ErrProcessTimeout is the error of a process killed at its Timeout.
var ErrProcessTimeout = errors.New("the command ran past its timeout and was killed")

// Process is a command running in a sandbox, started by StartProcess.
// Read its output with Wait; cancelling the context it was started with
// only stops reading: the process goes on until it ends or is killed.
type Process struct {
	PID     uint32
	c       *Client
	sb      Sandbox
	user    string
	timeout time.Duration
	pc      processpbconnect.ProcessClient
	stream  *connect.ServerStreamForClient[processpb.StartResponse]
	sel     *processpb.ProcessSelector
	cancel  context.CancelFunc
}

// basicUser sets the user of an envd request as E2B's SDK does: Basic auth
// with no password.
func basicUser(h interface{ Set(string, string) }, user string) {
	if user != "" {
		h.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	}
}

// StartProcess starts a command and returns once envd reports its PID.
func (c *Client) StartProcess(ctx context.Context, sb Sandbox, r ProcessRequest) (*Process, error) {
	hc, base := c.Envd(sb)
	pc := processpbconnect.NewProcessClient(hc, base)
	cfg := &processpb.ProcessConfig{Cmd: r.Cmd, Args: r.Args, Envs: r.Envs}
	if r.Cwd != "" {
		cfg.Cwd = &r.Cwd
	}
	stdin := r.Stdin
	req := connect.NewRequest(&processpb.StartRequest{Process: cfg, Stdin: &stdin})
	basicUser(req.Header(), r.User)
	// The stream's deadline is the command's timeout: Connect sends it to
	// envd, which kills the command when it passes.
	sctx, cancel := ctx, context.CancelFunc(func() {})
	if r.Timeout > 0 {
		sctx, cancel = context.WithTimeout(ctx, r.Timeout)
	}
	stream, err := pc.Start(sctx, req)
	if err != nil {
		cancel()
		return nil, c.explain(ctx, sb, err)
	}
	if !stream.Receive() {
		err := stream.Err()
		stream.Close()
		cancel()
		if err == nil {
			err = errors.New("the process stream ended before its start event")
		}
		return nil, c.explain(ctx, sb, err)
	}
	pid := stream.Msg().GetEvent().GetStart().GetPid()
	if pid == 0 {
		stream.Close()
		cancel()
		return nil, fmt.Errorf("got %v first, want the process's start event", stream.Msg().GetEvent())
	}
	return &Process{PID: pid, c: c, sb: sb, user: r.User, timeout: r.Timeout, pc: pc, stream: stream, cancel: cancel,
		sel: &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: pid}}}, nil
}

// Wait streams the process's output to stdout and stderr (either may be
// nil) until it ends, and returns its exit code (-1 when a signal ended
// it) and output. A process killed at its timeout is ErrProcessTimeout.
func (p *Process) Wait(stdout, stderr io.Writer) (ExecResult, error) {
	defer p.Close()
	var res ExecResult
	var outBuf, errBuf bytes.Buffer
	for p.stream.Receive() {
		ev := p.stream.Msg().GetEvent()
		if d := ev.GetData(); d != nil {
			if b := d.GetStdout(); b != nil {
				outBuf.Write(b)
				if stdout != nil {
					stdout.Write(b)
				}
			}
			if b := d.GetStderr(); b != nil {
				errBuf.Write(b)
				if stderr != nil {
					stderr.Write(b)
				}
			}
		}
		if end := ev.GetEnd(); end != nil {
			res.ExitCode = int(end.GetExitCode())
			res.Stdout, res.Stderr = outBuf.Bytes(), errBuf.Bytes()
			if end.Error != nil && end.GetError() != "" {
				return res, fmt.Errorf("process error: %s", end.GetError())
			}
			return res, nil
		}
	}
	res.Stdout, res.Stderr = outBuf.Bytes(), errBuf.Bytes()
	err := p.stream.Err()
	if p.timeout > 0 && connect.CodeOf(err) == connect.CodeDeadlineExceeded {
		return res, fmt.Errorf("%w (after %s)", ErrProcessTimeout, p.timeout)
	}
	if err != nil {
		return res, p.c.explain(context.Background(), p.sb, err)
	}
	return res, errors.New("the process stream ended without an exit code")
}

// CopyStdin streams r to the process's stdin (started with Stdin) and
// closes it at r's end, so that the process reads end-of-file.
func (p *Process) CopyStdin(ctx context.Context, r io.Reader) error {
	s := p.pc.StreamInput(ctx)
	basicUser(s.RequestHeader(), p.user)
	err := s.Send(&processpb.StreamInputRequest{Event: &processpb.StreamInputRequest_Start{
		Start: &processpb.StreamInputRequest_StartEvent{Process: p.sel}}})
	buf := make([]byte, 32<<10)
	for err == nil {
		n, rerr := r.Read(buf)
		if n > 0 {
			err = s.Send(&processpb.StreamInputRequest{Event: &processpb.StreamInputRequest_Data{
				Data: &processpb.StreamInputRequest_DataEvent{Input: &processpb.ProcessInput{
					Input: &processpb.ProcessInput_Stdin{Stdin: append([]byte(nil), buf[:n]...)}}}}})
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			err = rerr
		}
	}
	// A failed Send's cause is in the response.
	if _, cerr := s.CloseAndReceive(); err == nil || errors.Is(err, io.EOF) {
		err = cerr
	}
	// Closed even after a failure, so that the process is not left
	// waiting for more input.
	if cerr := p.CloseStdin(ctx); err == nil {
		err = cerr
	}
	return err
}

// CloseStdin closes the process's stdin.
func (p *Process) CloseStdin(ctx context.Context) error {
	req := connect.NewRequest(&processpb.CloseStdinRequest{Process: p.sel})
	basicUser(req.Header(), p.user)
	_, err := p.pc.CloseStdin(ctx, req)
	return err
}

// Terminate sends SIGTERM to the process and its process group.
func (p *Process) Terminate(ctx context.Context) error {
	return p.signal(ctx, processpb.Signal_SIGNAL_SIGTERM)
}

// Kill sends SIGKILL to the process and its process group.
func (p *Process) Kill(ctx context.Context) error {
	return p.signal(ctx, processpb.Signal_SIGNAL_SIGKILL)
}

func (p *Process) signal(ctx context.Context, sig processpb.Signal) error {
	req := connect.NewRequest(&processpb.SendSignalRequest{Process: p.sel, Signal: sig})
	basicUser(req.Header(), p.user)
	_, err := p.pc.SendSignal(ctx, req)
	return err
}

// Close stops reading the process's output; the process goes on.
func (p *Process) Close() error {
	err := p.stream.Close()
	p.cancel()
	return err
}
