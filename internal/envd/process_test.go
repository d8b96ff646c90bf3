package envd_test

import (
	"context"
	"errors"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	pb "github.com/agentenv/agentenv/client/api/envd/processpb"
	"github.com/agentenv/agentenv/internal/envd"
)

// result is what one Start stream delivered.
type result struct {
	pid            uint32
	stdout, stderr string
	end            *pb.ProcessEvent_EndEvent
}

// events reads a process stream to its end. The first event must be start.
func events(t *testing.T, recv func() bool, msg func() *pb.ProcessEvent, streamErr func() error) (result, error) {
	t.Helper()
	var r result
	first := true
	for recv() {
		ev := msg()
		if first {
			first = false
			if ev.GetStart() == nil {
				t.Fatalf("got first event %v, want a start event", ev)
			}
			r.pid = ev.GetStart().GetPid()
			continue
		}
		switch {
		case ev.GetStart() != nil:
			t.Errorf("got a second start event %v", ev)
		case ev.GetData() != nil:
			r.stdout += string(ev.GetData().GetStdout())
			r.stderr += string(ev.GetData().GetStderr())
		case ev.GetEnd() != nil:
			if r.end != nil {
				t.Errorf("got a second end event %v", ev)
			}
			r.end = ev.GetEnd()
		}
	}
	return r, streamErr()
}

func (d *daemon) run(ctx context.Context, req *pb.StartRequest) (result, error) {
	d.t.Helper()
	s, err := d.proc.Start(ctx, connect.NewRequest(req))
	if err != nil {
		return result{}, err
	}
	defer s.Close()
	return events(d.t, s.Receive, func() *pb.ProcessEvent { return s.Msg().GetEvent() }, s.Err)
}

// first opens a Start stream and returns it after the start event.
func (d *daemon) first(ctx context.Context, req *pb.StartRequest) (*connect.ServerStreamForClient[pb.StartResponse], uint32) {
	d.t.Helper()
	s, err := d.proc.Start(ctx, connect.NewRequest(req))
	if err != nil {
		d.t.Fatalf("Start: %v", err)
	}
	if !s.Receive() {
		d.t.Fatalf("Start: no first event: %v", s.Err())
	}
	st := s.Msg().GetEvent().GetStart()
	if st == nil || st.GetPid() == 0 {
		d.t.Fatalf("got first event %v, want a start event with a pid", s.Msg().GetEvent())
	}
	return s, st.GetPid()
}

func (d *daemon) list() map[uint32]*pb.ProcessInfo {
	d.t.Helper()
	resp, err := d.proc.List(context.Background(), connect.NewRequest(&pb.ListRequest{}))
	if err != nil {
		d.t.Fatalf("List: %v", err)
	}
	out := map[uint32]*pb.ProcessInfo{}
	for _, p := range resp.Msg.GetProcesses() {
		if p.GetConfig() == nil {
			d.t.Errorf("List: process %d has no config (the SDK dereferences it)", p.GetPid())
		}
		out[p.GetPid()] = p
	}
	return out
}

func sh(script string) *pb.StartRequest {
	return &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", script}}, Stdin: proto.Bool(false)}
}

func TestStartOutputAndExitCode(t *testing.T) {
	d := startDaemon(t, envd.Config{AccessToken: testToken})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tests := []struct {
		name, script   string
		stdout, stderr string
		code           int32
	}{
		{"ok", "echo hello", "hello\n", "", 0},
		{"both streams and exit code", "echo out; echo err >&2; exit 3", "out\n", "err\n", 3},
		{"no output", "exit 0", "", "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := d.run(ctx, sh(tt.script))
			if err != nil {
				t.Fatalf("Start: %v", err)
			}
			if r.pid == 0 {
				t.Errorf("got pid 0 in the start event")
			}
			if r.stdout != tt.stdout || r.stderr != tt.stderr {
				t.Errorf("got stdout %q stderr %q, want %q %q", r.stdout, r.stderr, tt.stdout, tt.stderr)
			}
			if r.end == nil {
				t.Fatalf("stream ended without an end event")
			}
			if r.end.GetExitCode() != tt.code || !r.end.GetExited() {
				t.Errorf("got end %v, want exit code %d, exited", r.end, tt.code)
			}
			if got, want := r.end.GetStatus(), "exit status "+strconv.Itoa(int(tt.code)); got != want {
				t.Errorf("got status %q, want %q", got, want)
			}
		})
	}
}

func TestStartErrors(t *testing.T) {
	d := startDaemon(t, envd.Config{AccessToken: testToken})
	dir := t.TempDir()
	tests := []struct {
		name string
		req  *pb.StartRequest
		code connect.Code
	}{
		{"missing program", &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: filepath.Join(dir, "no-such-program")}}, connect.CodeInvalidArgument},
		{"missing program on PATH", &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "agentenv-no-such-program"}}, connect.CodeInvalidArgument},
		{"empty cmd", &pb.StartRequest{Process: &pb.ProcessConfig{}}, connect.CodeInvalidArgument},
		{"missing cwd", &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/true", Cwd: proto.String(filepath.Join(dir, "nope"))}}, connect.CodeInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := len(d.list())
			r, err := d.run(context.Background(), tt.req)
			if err == nil {
				t.Fatalf("got result %+v, want an error", r)
			}
			if got := connect.CodeOf(err); got != tt.code {
				t.Errorf("got code %v (%v), want %v", got, err, tt.code)
			}
			if after := len(d.list()); after != before {
				t.Errorf("got %d processes listed after a failed start, want %d", after, before)
			}
		})
	}
}

func TestStartCwdAndEnvs(t *testing.T) {
	d := startDaemon(t, envd.Config{AccessToken: testToken, Envs: map[string]string{"A": "cfg-a", "B": "cfg-b"}})
	dir := t.TempDir()
	rel, err := filepath.Rel(d.home, dir)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		cwd  *string
		want string
	}{
		{"absolute cwd", proto.String(dir), dir},
		{"relative cwd is taken from home", proto.String(rel), dir},
		{"no cwd is home", nil, d.home},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := sh(`pwd -P; echo "$A $B $C $HOME"`)
			req.Process.Cwd = tt.cwd
			req.Process.Envs = map[string]string{"B": "req-b", "C": "req-c"}
			r, err := d.run(context.Background(), req)
			if err != nil {
				t.Fatalf("Start: %v", err)
			}
			wantDir, _ := filepath.EvalSymlinks(tt.want)
			if want := wantDir + "\ncfg-a req-b req-c " + d.home + "\n"; r.stdout != want {
				t.Errorf("got stdout %q, want %q (stderr %q)", r.stdout, want, r.stderr)
			}
		})
	}
}

func TestStartTimeoutKillsProcess(t *testing.T) {
	d := startDaemon(t, envd.Config{AccessToken: testToken})
	// The client's deadline becomes Connect-Timeout-Ms: the process lifetime.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	s, pid := d.first(ctx, &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "sleep", Args: []string{"30"}}})
	for s.Receive() {
	}
	if got := connect.CodeOf(s.Err()); got != connect.CodeDeadlineExceeded {
		t.Errorf("got stream error %v, want deadline_exceeded", s.Err())
	}
	s.Close()
	waitFor(t, "the timed-out process to leave the list", func() bool { return d.list()[pid] == nil })
	if err := syscall.Kill(int(pid), 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("got kill(%d, 0) = %v, want ESRCH (process still alive)", pid, err)
	}
}

func TestBackgroundProcess(t *testing.T) {
	d := startDaemon(t, envd.Config{AccessToken: testToken})
	ctx, cancel := context.WithCancel(context.Background())
	s, pid := d.first(ctx, &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "sleep", Args: []string{"30"}}, Tag: proto.String("bg")})
	t.Cleanup(func() { syscall.Kill(int(pid), syscall.SIGKILL) })
	// The SDK's disconnect() aborts the request; the process must live on.
	cancel()
	s.Close()
	select {
	case <-d.startDone:
	case <-time.After(5 * time.Second):
		t.Fatal("the Start handler did not return after the client went away")
	}
	info := d.list()[pid]
	if info == nil {
		t.Fatalf("process %d is not listed after the client disconnected", pid)
	}
	if got := info.GetConfig().GetCmd(); got != "sleep" {
		t.Errorf("got listed cmd %q, want sleep", got)
	}
	if got := info.GetConfig().GetArgs(); !slices.Equal(got, []string{"30"}) {
		t.Errorf("got listed args %q, want [30]", got)
	}
	if got := info.GetTag(); got != "bg" {
		t.Errorf("got listed tag %q, want bg", got)
	}
	if err := syscall.Kill(int(pid), 0); err != nil {
		t.Fatalf("process %d is not alive: %v", pid, err)
	}

	// Re-attach, then kill it: the re-attached stream sees the end.
	cs, err := d.proc.Connect(context.Background(), connect.NewRequest(&pb.ConnectRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}}))
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	defer cs.Close()
	if !cs.Receive() || cs.Msg().GetEvent().GetStart().GetPid() != pid {
		t.Fatalf("Connect: got first event %v (err %v), want start with pid %d", cs.Msg().GetEvent(), cs.Err(), pid)
	}
	_, err = d.proc.SendSignal(context.Background(), connect.NewRequest(&pb.SendSignalRequest{
		Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Tag{Tag: "bg"}}, Signal: pb.Signal_SIGNAL_SIGKILL}))
	if err != nil {
		t.Fatalf("SendSignal: %v", err)
	}
	var end *pb.ProcessEvent_EndEvent
	for cs.Receive() {
		if e := cs.Msg().GetEvent().GetEnd(); e != nil {
			end = e
		}
	}
	if cs.Err() != nil {
		t.Errorf("Connect stream: %v", cs.Err())
	}
	if end == nil || end.GetExited() {
		t.Errorf("got end event %v, want one for a killed (not exited) process", end)
	}
	if d.list()[pid] != nil {
		t.Errorf("process %d is still listed after its end event", pid)
	}

	_, err = d.proc.SendSignal(context.Background(), connect.NewRequest(&pb.SendSignalRequest{
		Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}, Signal: pb.Signal_SIGNAL_SIGKILL}))
	if got := connect.CodeOf(err); got != connect.CodeNotFound {
		t.Errorf("SendSignal to a gone process: got %v, want not_found (the SDK's kill() returns false on it)", err)
	}
}

func TestStdin(t *testing.T) {
	d := startDaemon(t, envd.Config{AccessToken: testToken})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	t.Run("send and close", func(t *testing.T) {
		s, pid := d.first(ctx, &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "cat"}, Stdin: proto.Bool(true)})
		defer s.Close()
		sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
		for _, chunk := range []string{"hello ", "world\n"} {
			if _, err := d.proc.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: sel, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte(chunk)}}})); err != nil {
				t.Fatalf("SendInput: %v", err)
			}
		}
		if _, err := d.proc.CloseStdin(ctx, connect.NewRequest(&pb.CloseStdinRequest{Process: sel})); err != nil {
			t.Fatalf("CloseStdin: %v", err)
		}
		var out string
		var end *pb.ProcessEvent_EndEvent
		for s.Receive() {
			ev := s.Msg().GetEvent()
			out += string(ev.GetData().GetStdout())
			if ev.GetEnd() != nil {
				end = ev.GetEnd()
			}
		}
		if s.Err() != nil {
			t.Fatalf("stream: %v", s.Err())
		}
		if out != "hello world\n" {
			t.Errorf("got stdout %q, want %q", out, "hello world\n")
		}
		if end == nil || end.GetExitCode() != 0 {
			t.Errorf("got end %v, want exit code 0", end)
		}
	})

	t.Run("stdin false does not hang", func(t *testing.T) {
		r, err := d.run(ctx, &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "cat"}, Stdin: proto.Bool(false)})
		if err != nil {
			t.Fatalf("Start: %v", err)
		}
		if r.end == nil || r.end.GetExitCode() != 0 {
			t.Errorf("got end %v, want exit code 0", r.end)
		}
	})
}

func TestListAlwaysHasConfig(t *testing.T) {
	d := startDaemon(t, envd.Config{AccessToken: testToken})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var pids []uint32
	for _, req := range []*pb.StartRequest{
		{Process: &pb.ProcessConfig{Cmd: "sleep", Args: []string{"30"}}},
		{Process: &pb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "sleep 30"}, Envs: map[string]string{"X": "1"}, Cwd: proto.String(t.TempDir())}},
	} {
		s, pid := d.first(ctx, req)
		defer s.Close()
		pids = append(pids, pid)
		t.Cleanup(func() { syscall.Kill(-int(pid), syscall.SIGKILL) })
	}
	got := d.list() // list() reports processes without config
	for _, pid := range pids {
		if got[pid] == nil {
			t.Errorf("process %d not listed", pid)
		}
	}
}

func TestProcessAuth(t *testing.T) {
	d := startDaemon(t, envd.Config{AccessToken: testToken})
	tests := []struct {
		name string
		h    http.Header
	}{
		{"no token", http.Header{}},
		{"wrong token", http.Header{"X-Access-Token": {"nope"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			proc, fs := d.clients(tt.h)
			_, err := proc.List(context.Background(), connect.NewRequest(&pb.ListRequest{}))
			if got := connect.CodeOf(err); got != connect.CodeUnauthenticated {
				t.Errorf("List: got %v, want unauthenticated", err)
			}
			_, err = fs.Stat(context.Background(), connect.NewRequest(statReq(t.TempDir())))
			if got := connect.CodeOf(err); got != connect.CodeUnauthenticated {
				t.Errorf("Stat: got %v, want unauthenticated", err)
			}
		})
	}
	t.Run("unknown user", func(t *testing.T) {
		proc, _ := d.clients(http.Header{"X-Access-Token": {testToken}, "Authorization": {basicUser("agentenv-no-such-user")}})
		s, err := proc.Start(context.Background(), connect.NewRequest(sh("true")))
		if err == nil {
			for s.Receive() {
			}
			err = s.Err()
		}
		if got := connect.CodeOf(err); got != connect.CodeInvalidArgument {
			t.Errorf("Start as an unknown user: got %v, want invalid_argument", err)
		}
	})
}
