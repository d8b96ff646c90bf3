package envd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	pb "github.com/agentenv/agentenv/client/api/envd/processpb"
	"github.com/agentenv/agentenv/client/api/envd/processpb/processpbconnect"
)

// keepaliveDefault is how often a stream sends a keepalive event when the
// client does not ask for another interval.
const keepaliveDefault = 50 * time.Second

// proc is one process started through the Process service.
type proc struct {
	pid    uint32
	tag    *string
	config *pb.ProcessConfig
	cmd    *exec.Cmd

	stdinMu sync.Mutex
	stdin   io.WriteCloser // nil once closed or when stdin was not asked for

	// tty is the PTY master of a process started with a PTY (else nil);
	// term is its terminal side until the process holds it.
	tty, term *os.File

	mu   sync.Mutex
	subs map[chan *pb.ProcessEvent]struct{}
	end  *pb.ProcessEvent_EndEvent
	done chan struct{}
}

func (p *proc) subscribe() (chan *pb.ProcessEvent, func()) {
	ch := make(chan *pb.ProcessEvent, 256)
	p.mu.Lock()
	p.subs[ch] = struct{}{}
	p.mu.Unlock()
	return ch, func() {
		p.mu.Lock()
		delete(p.subs, ch)
		p.mu.Unlock()
	}
}

// publish sends an event to every subscriber. A subscriber that cannot keep
// up blocks the process's output, like a full pipe would; output is never
// dropped.
func (p *proc) publish(ev *pb.ProcessEvent) {
	p.mu.Lock()
	subs := make([]chan *pb.ProcessEvent, 0, len(p.subs))
	for ch := range p.subs {
		subs = append(subs, ch)
	}
	p.mu.Unlock()
	for _, ch := range subs {
		select {
		case ch <- ev:
		case <-time.After(30 * time.Second):
			// A stalled client must not wedge the process forever.
		}
	}
}

// processService implements the Connect process.Process service.
type processService struct {
	processpbconnect.UnimplementedProcessHandler
	s *Server

	mu    sync.Mutex
	procs map[uint32]*proc
}

func newProcessService(s *Server) *processService {
	return &processService{s: s, procs: map[uint32]*proc{}}
}

func (ps *processService) find(sel *pb.ProcessSelector) (*proc, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	switch v := sel.GetSelector().(type) {
	case *pb.ProcessSelector_Pid:
		if p, ok := ps.procs[v.Pid]; ok {
			return p, nil
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d not found", v.Pid))
	case *pb.ProcessSelector_Tag:
		for _, p := range ps.procs {
			if p.tag != nil && *p.tag == v.Tag {
				return p, nil
			}
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with tag %q not found", v.Tag))
	}
	return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("select a process by pid or tag"))
}

func (ps *processService) List(ctx context.Context, req *connect.Request[pb.ListRequest]) (*connect.Response[pb.ListResponse], error) {
	ps.mu.Lock()
	out := &pb.ListResponse{}
	for _, p := range ps.procs {
		out.Processes = append(out.Processes, &pb.ProcessInfo{Config: p.config, Pid: p.pid, Tag: p.tag})
	}
	ps.mu.Unlock()
	sort.Slice(out.Processes, func(i, j int) bool { return out.Processes[i].Pid < out.Processes[j].Pid })
	return connect.NewResponse(out), nil
}

func (ps *processService) Start(ctx context.Context, req *connect.Request[pb.StartRequest], stream *connect.ServerStream[pb.StartResponse]) error {
	cfg := req.Msg.GetProcess()
	if cfg.GetCmd() == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("process.cmd is empty: name the program to run"))
	}
	acct, err := connectUser(req.Header())
	if err != nil {
		return err
	}
	p, err := ps.spawn(cfg, acct, req.Msg.Tag, req.Msg.Stdin == nil || req.Msg.GetStdin(), req.Msg.GetPty())
	if err != nil {
		return err
	}
	ch, unsub := p.subscribe()
	defer unsub()
	// Start the process only once someone listens, so no output is lost.
	if err := ps.run(p); err != nil {
		return err
	}
	send := func(ev *pb.ProcessEvent) error { return stream.Send(&pb.StartResponse{Event: ev}) }
	if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Start{Start: &pb.ProcessEvent_StartEvent{Pid: p.pid}}}); err != nil {
		return err
	}
	// The client's timeout (Connect-Timeout-Ms) is the command's lifetime,
	// even after the client disconnects; a cancelled request alone leaves
	// the process running (background commands).
	var timedOut atomic.Bool
	if dl, ok := ctx.Deadline(); ok {
		t := time.AfterFunc(time.Until(dl), func() {
			timedOut.Store(true)
			p.signal(syscall.SIGKILL)
		})
		go func() { <-p.done; t.Stop() }()
	}
	return pump(ctx, p, ch, keepalive(req.Header()), send, timedOut.Load)
}

func (ps *processService) Connect(ctx context.Context, req *connect.Request[pb.ConnectRequest], stream *connect.ServerStream[pb.ConnectResponse]) error {
	p, err := ps.find(req.Msg.GetProcess())
	if err != nil {
		return err
	}
	ch, unsub := p.subscribe()
	defer unsub()
	send := func(ev *pb.ProcessEvent) error { return stream.Send(&pb.ConnectResponse{Event: ev}) }
	if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Start{Start: &pb.ProcessEvent_StartEvent{Pid: p.pid}}}); err != nil {
		return err
	}
	return pump(ctx, p, ch, keepalive(req.Header()), send, nil)
}

// pump forwards a process's events to a stream until the process ends, the
// client goes away or a send fails.
// timedOut, when not nil, reports whether the stream's own deadline killed
// the process: then the stream ends with deadline_exceeded (what the E2B
// SDK reports as a timeout), not with the end event of the killed process.
func pump(ctx context.Context, p *proc, ch chan *pb.ProcessEvent, every time.Duration, send func(*pb.ProcessEvent) error, timedOut func() bool) error {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case ev := <-ch:
			if err := send(ev); err != nil {
				return err
			}
		case <-p.done:
			// Drain what was published before the end, then the end event.
			for {
				select {
				case ev := <-ch:
					if err := send(ev); err != nil {
						return err
					}
					continue
				default:
				}
				break
			}
			if timedOut != nil && timedOut() {
				return connect.NewError(connect.CodeDeadlineExceeded, errors.New("the command's timeout passed: it was killed"))
			}
			p.mu.Lock()
			end := p.end
			p.mu.Unlock()
			return send(&pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: end}})
		case <-tick.C:
			if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Keepalive{Keepalive: &pb.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
		}
	}
}

func keepalive(h interface{ Get(string) string }) time.Duration {
	if v, err := strconv.Atoi(h.Get("Keepalive-Ping-Interval")); err == nil && v > 0 {
		return time.Duration(v) * time.Second
	}
	return keepaliveDefault
}

// spawn prepares a process; run starts it.
func (ps *processService) spawn(cfg *pb.ProcessConfig, acct account, tag *string, wantStdin bool, pty *pb.PTY) (*proc, error) {
	cmd := exec.Command(commandPath(cfg.GetCmd()), cfg.GetArgs()...)
	cmd.Env = ps.s.environ(acct, cfg.GetEnvs())
	cmd.Dir = acct.Home
	cwd := defaultWorkdir()
	if cfg.Cwd != nil && cfg.GetCwd() != "" {
		cwd = cfg.GetCwd()
	}
	if cwd != "" {
		dir, err := resolvePath(cwd, acct)
		if err != nil {
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("working directory: %w", err))
		}
		cmd.Dir = dir
	}
	err := asUser(acct, func() error {
		st, err := os.Stat(cmd.Dir)
		if err == nil && !st.IsDir() {
			return syscall.ENOTDIR
		}
		if err != nil {
			return err
		}
		// The command's chdir needs search permission; its failure would
		// only say "fork/exec: permission denied".
		if err := unix.Access(cmd.Dir, unix.X_OK); err != nil {
			return &fs.PathError{Op: "chdir", Path: cmd.Dir, Err: err}
		}
		return nil
	})
	switch {
	case errors.Is(err, fs.ErrPermission):
		return nil, connect.NewError(connect.CodePermissionDenied, errors.New(deniedMessage(err, acct, "enter working directory", cmd.Dir)+`; use a directory that user may enter, or run the command as user "root"`))
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("working directory %q does not exist", cmd.Dir))
	case err != nil:
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("working directory %q: %w", cmd.Dir, err))
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if os.Getuid() == 0 && acct.UID != 0 {
		cmd.SysProcAttr.Credential = acct.credential()
	}
	p := &proc{tag: tag, config: cfg, cmd: cmd, subs: map[chan *pb.ProcessEvent]struct{}{}, done: make(chan struct{})}
	if pty != nil {
		return p, p.attachPTY(pty, acct)
	}
	if wantStdin {
		w, err := cmd.StdinPipe()
		if err != nil {
			return nil, connect.NewError(connect.CodeInternal, err)
		}
		p.stdin = w
	}
	return p, nil
}

func (ps *processService) run(p *proc) error {
	var wg sync.WaitGroup
	if p.tty != nil {
		err := startChild(p.cmd)
		p.term.Close() // the process holds it now (or never will)
		if err != nil {
			p.tty.Close()
			return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("start %s: %w", p.config.GetCmd(), err))
		}
		wg.Add(1)
		go p.copyOut(&wg, p.tty, ptyData)
	} else {
		stdout, err := p.cmd.StdoutPipe()
		if err != nil {
			return connect.NewError(connect.CodeInternal, err)
		}
		stderr, err := p.cmd.StderrPipe()
		if err != nil {
			return connect.NewError(connect.CodeInternal, err)
		}
		if err := startChild(p.cmd); err != nil {
			return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("start %s: %w", p.config.GetCmd(), err))
		}
		wg.Add(2)
		go p.copyOut(&wg, stdout, stdoutData)
		go p.copyOut(&wg, stderr, stderrData)
	}
	p.pid = uint32(p.cmd.Process.Pid)
	ps.mu.Lock()
	ps.procs[p.pid] = p
	ps.mu.Unlock()
	ps.s.guard.Started()

	go func() {
		wg.Wait()
		err := waitChild(p.cmd)
		end := &pb.ProcessEvent_EndEvent{Exited: true}
		if st := p.cmd.ProcessState; st != nil {
			ws := st.Sys().(syscall.WaitStatus)
			end.ExitCode = int32(st.ExitCode())
			end.Status = "exit status " + strconv.Itoa(st.ExitCode())
			if ws.Signaled() {
				end.Exited = false
				end.ExitCode = -1
				end.Status = "signal: " + ws.Signal().String()
			}
		}
		if err != nil && p.cmd.ProcessState == nil {
			msg := err.Error()
			end.Error = &msg
		}
		if k, ok := ps.s.guard.Killed(int(p.pid)); ok {
			markOOM(end, k)
		}
		p.mu.Lock()
		p.end = end
		p.mu.Unlock()
		p.closeStdin()
		if p.tty != nil {
			p.tty.Close()
		}
		ps.mu.Lock()
		delete(ps.procs, p.pid)
		ps.mu.Unlock()
		close(p.done)
	}()
	return nil
}

func stdoutData(b []byte) *pb.ProcessEvent_DataEvent {
	return &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Stdout{Stdout: b}}
}

func stderrData(b []byte) *pb.ProcessEvent_DataEvent {
	return &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Stderr{Stderr: b}}
}

func ptyData(b []byte) *pb.ProcessEvent_DataEvent {
	return &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Pty{Pty: b}}
}

// copyOut publishes what r yields until it ends: EOF for a pipe, EIO for a
// PTY master once no process holds the terminal any more.
func (p *proc) copyOut(wg *sync.WaitGroup, r io.Reader, event func([]byte) *pb.ProcessEvent_DataEvent) {
	defer wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			data := append([]byte(nil), buf[:n]...)
			p.publish(&pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: event(data)}})
		}
		if err != nil {
			return
		}
	}
}

func (p *proc) signal(sig syscall.Signal) error {
	// The process leads its own group: signal the group so children go too.
	if err := syscall.Kill(-int(p.pid), sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	return nil
}

func (p *proc) closeStdin() error {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdin == nil {
		return nil
	}
	err := p.stdin.Close()
	p.stdin = nil
	return err
}

func (p *proc) writeStdin(b []byte) error {
	if p.tty != nil {
		return connect.NewError(connect.CodeFailedPrecondition, errors.New("this process has a PTY: send its input as PTY input, not stdin"))
	}
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdin == nil {
		return connect.NewError(connect.CodeFailedPrecondition, errors.New("stdin of this process is closed or was not requested (start it with stdin: true)"))
	}
	_, err := p.stdin.Write(b)
	return err
}

func (ps *processService) SendInput(ctx context.Context, req *connect.Request[pb.SendInputRequest]) (*connect.Response[pb.SendInputResponse], error) {
	p, err := ps.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := p.write(req.Msg.GetInput()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.SendInputResponse{}), nil
}

func (ps *processService) StreamInput(ctx context.Context, stream *connect.ClientStream[pb.StreamInputRequest]) (*connect.Response[pb.StreamInputResponse], error) {
	var p *proc
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *pb.StreamInputRequest_Start:
			found, err := ps.find(ev.Start.GetProcess())
			if err != nil {
				return nil, err
			}
			p = found
		case *pb.StreamInputRequest_Data:
			if p == nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("send a start event naming the process before data"))
			}
			if err := p.write(ev.Data.GetInput()); err != nil {
				return nil, err
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.StreamInputResponse{}), nil
}

func (ps *processService) CloseStdin(ctx context.Context, req *connect.Request[pb.CloseStdinRequest]) (*connect.Response[pb.CloseStdinResponse], error) {
	p, err := ps.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if p.tty != nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("this process has a PTY, which has no stdin to close: send Ctrl+D (0x04) as PTY input instead"))
	}
	if err := p.closeStdin(); err != nil {
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	return connect.NewResponse(&pb.CloseStdinResponse{}), nil
}

func (ps *processService) SendSignal(ctx context.Context, req *connect.Request[pb.SendSignalRequest]) (*connect.Response[pb.SendSignalResponse], error) {
	p, err := ps.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	var sig syscall.Signal
	switch req.Msg.GetSignal() {
	case pb.Signal_SIGNAL_SIGKILL:
		sig = syscall.SIGKILL
	case pb.Signal_SIGNAL_SIGTERM:
		sig = syscall.SIGTERM
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("signal %v is not supported: use SIGTERM or SIGKILL", req.Msg.GetSignal()))
	}
	if err := p.signal(sig); err != nil {
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	return connect.NewResponse(&pb.SendSignalResponse{}), nil
}

// environ builds a command's environment: the sandbox's variables, the
// user's identity, then the request's own variables.
func (s *Server) environ(a account, extra map[string]string) []string {
	env := map[string]string{
		"PATH":    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME":    a.Home,
		"USER":    a.Name,
		"LOGNAME": a.Name,
	}
	s.mu.Lock()
	for k, v := range s.envs {
		env[k] = v
	}
	s.mu.Unlock()
	for k, v := range extra {
		env[k] = v
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}
