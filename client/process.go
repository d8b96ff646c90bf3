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

	"github.com/agentenv/agentenv/client/api/envd/processpb"
	"github.com/agentenv/agentenv/client/api/envd/processpb/processpbconnect"
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
	stream  eventStream
	sel     *processpb.ProcessSelector
	cancel  context.CancelFunc
}

// eventStream is a stream of a process's events: Start's, or Connect's
// for a process started before.
type eventStream interface {
	Receive() bool
	Err() error
	Close() error
	event() *processpb.ProcessEvent
}

type startStream struct {
	*connect.ServerStreamForClient[processpb.StartResponse]
}

func (s startStream) event() *processpb.ProcessEvent { return s.Msg().GetEvent() }

type connectStream struct {
	*connect.ServerStreamForClient[processpb.ConnectResponse]
}

func (s connectStream) event() *processpb.ProcessEvent { return s.Msg().GetEvent() }

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
	return &Process{PID: pid, c: c, sb: sb, user: r.User, timeout: r.Timeout, pc: pc, stream: startStream{stream}, cancel: cancel,
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
		ev := p.stream.event()
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
				return res, endError(end.GetError())
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

// ProcessInfo is a process running in a sandbox that was started through
// envd (by this client, an SDK or a template's start command).
type ProcessInfo struct {
	PID  uint32
	Cmd  string
	Args []string
	Cwd  string
	Tag  string
}

// ListProcesses lists the processes envd started that still run.
func (c *Client) ListProcesses(ctx context.Context, sb Sandbox) ([]ProcessInfo, error) {
	hc, base := c.Envd(sb)
	resp, err := processpbconnect.NewProcessClient(hc, base).List(ctx, connect.NewRequest(&processpb.ListRequest{}))
	if err != nil {
		return nil, c.explain(ctx, sb, err)
	}
	var out []ProcessInfo
	for _, p := range resp.Msg.GetProcesses() {
		cfg := p.GetConfig()
		out = append(out, ProcessInfo{PID: p.GetPid(), Cmd: cfg.GetCmd(), Args: cfg.GetArgs(), Cwd: cfg.GetCwd(), Tag: p.GetTag()})
	}
	return out, nil
}

// ConnectProcess attaches to a process started earlier (by PID, as
// ListProcesses or another client's StartProcess gives it): Wait then
// streams its output from now on and returns its exit code. user is the
// user its signals and input are sent as (empty: envd's default).
func (c *Client) ConnectProcess(ctx context.Context, sb Sandbox, pid uint32, user string) (*Process, error) {
	hc, base := c.Envd(sb)
	pc := processpbconnect.NewProcessClient(hc, base)
	sel := &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: pid}}
	req := connect.NewRequest(&processpb.ConnectRequest{Process: sel})
	basicUser(req.Header(), user)
	stream, err := pc.Connect(ctx, req)
	if err != nil {
		return nil, c.explain(ctx, sb, err)
	}
	if !stream.Receive() {
		err := stream.Err()
		stream.Close()
		if err == nil {
			err = errors.New("the process stream ended before its start event")
		}
		return nil, c.explain(ctx, sb, err)
	}
	if got := stream.Msg().GetEvent().GetStart().GetPid(); got != pid {
		stream.Close()
		return nil, fmt.Errorf("got %v first, want process %d's start event", stream.Msg().GetEvent(), pid)
	}
	return &Process{PID: pid, c: c, sb: sb, user: user, pc: pc, stream: connectStream{stream}, cancel: func() {}, sel: sel}, nil
}

// SendStdin writes b to the process's stdin (started with Stdin).
func (p *Process) SendStdin(ctx context.Context, b []byte) error {
	req := connect.NewRequest(&processpb.SendInputRequest{Process: p.sel,
		Input: &processpb.ProcessInput{Input: &processpb.ProcessInput_Stdin{Stdin: b}}})
	basicUser(req.Header(), p.user)
	_, err := p.pc.SendInput(ctx, req)
	return err
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

// ExecResult is the outcome of a command.
type ExecResult struct {
	ExitCode int
	Stdout   []byte
	Stderr   []byte
}

// Exec runs cmd with args in the sandbox through envd and waits for it.
// stdout/stderr, when not nil, receive the output as it streams.
func (c *Client) Exec(ctx context.Context, sb Sandbox, cmd string, args []string, stdout, stderr io.Writer) (ExecResult, error) {
	p, err := c.StartProcess(ctx, sb, ProcessRequest{Cmd: cmd, Args: args})
	if err != nil {
		return ExecResult{}, err
	}
	return p.Wait(stdout, stderr)
}
