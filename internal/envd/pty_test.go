package envd_test

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	pb "github.com/agentenv/agentenv/client/api/envd/processpb"
	"github.com/agentenv/agentenv/internal/envd"
)

// ptyScript answers lines typed at its terminal: "size" prints the
// terminal's size, "tty" whether stdin is a terminal, "exit" ends with 3.
const ptyScript = `while read l; do
case "$l" in
size) echo "size=$(stty size)";;
tty) [ -t 0 ] && echo "tty=yes";;
exit) exit 3;;
esac
done`

// ptyOutput collects a PTY stream's output and its end event.
type ptyOutput struct {
	mu   sync.Mutex
	out  strings.Builder
	end  *pb.ProcessEvent_EndEvent
	done chan struct{}
}

func readPTY(t *testing.T, recv func() bool, msg func() *pb.ProcessEvent) *ptyOutput {
	o := &ptyOutput{done: make(chan struct{})}
	go func() {
		defer close(o.done)
		for recv() {
			ev := msg()
			o.mu.Lock()
			if d := ev.GetData(); d != nil {
				if len(d.GetStdout()) > 0 || len(d.GetStderr()) > 0 {
					t.Errorf("got stdout/stderr %v from a PTY process, want PTY data only", d)
				}
				o.out.Write(d.GetPty())
			}
			if ev.GetEnd() != nil {
				o.end = ev.GetEnd()
			}
			o.mu.Unlock()
		}
	}()
	return o
}

func (o *ptyOutput) has(s string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return strings.Contains(o.out.String(), s)
}

func TestPTY(t *testing.T) {
	if _, err := os.Stat("/dev/ptmx"); err != nil {
		t.Skipf("no /dev/ptmx here: %v", err)
	}
	d := startDaemon(t, envd.Config{AccessToken: testToken})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req := sh(ptyScript)
	req.Pty = &pb.PTY{Size: &pb.PTY_Size{Cols: 100, Rows: 30}}
	s, pid := d.first(ctx, req)
	defer s.Close()
	o := readPTY(t, s.Receive, func() *pb.ProcessEvent { return s.Msg().GetEvent() })
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
	input := func(text string) {
		t.Helper()
		_, err := d.proc.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: sel,
			Input: &pb.ProcessInput{Input: &pb.ProcessInput_Pty{Pty: []byte(text)}}}))
		if err != nil {
			t.Fatalf("SendInput(%q): %v", text, err)
		}
	}

	input("tty\n")
	waitFor(t, "the process to see a terminal", func() bool { return o.has("tty=yes") })
	input("size\n")
	waitFor(t, "size 30x100", func() bool { return o.has("size=30 100") })
	if _, err := d.proc.Update(ctx, connect.NewRequest(&pb.UpdateRequest{Process: sel,
		Pty: &pb.PTY{Size: &pb.PTY_Size{Cols: 120, Rows: 50}}})); err != nil {
		t.Fatalf("Update (resize): %v", err)
	}
	input("size\n")
	waitFor(t, "size 50x120 after resize", func() bool { return o.has("size=50 120") })

	// A second client connects to the same PTY and sees its output too.
	c, err := d.proc.Connect(ctx, connect.NewRequest(&pb.ConnectRequest{Process: sel}))
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	defer c.Close()
	if !c.Receive() || c.Msg().GetEvent().GetStart().GetPid() != pid {
		t.Fatalf("Connect: got %v (%v), want the start event of pid %d", c.Msg(), c.Err(), pid)
	}
	o2 := readPTY(t, c.Receive, func() *pb.ProcessEvent { return c.Msg().GetEvent() })
	input("size\n")
	waitFor(t, "output on the connected stream", func() bool { return o2.has("size=50 120") })

	input("exit\n")
	for _, out := range []*ptyOutput{o, o2} {
		select {
		case <-out.done:
		case <-ctx.Done():
			t.Fatal("PTY streams did not end after exit")
		}
		if out.end.GetExitCode() != 3 || !out.end.GetExited() {
			t.Errorf("got end %v, want exit code 3", out.end)
		}
	}
}

func TestPTYKill(t *testing.T) {
	if _, err := os.Stat("/dev/ptmx"); err != nil {
		t.Skipf("no /dev/ptmx here: %v", err)
	}
	d := startDaemon(t, envd.Config{AccessToken: testToken})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req := sh("echo ready; sleep 60")
	req.Pty = &pb.PTY{Size: &pb.PTY_Size{Cols: 80, Rows: 24}}
	s, pid := d.first(ctx, req)
	defer s.Close()
	o := readPTY(t, s.Receive, func() *pb.ProcessEvent { return s.Msg().GetEvent() })
	waitFor(t, "ready", func() bool { return o.has("ready") })
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
	if _, err := d.proc.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: sel, Signal: pb.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatalf("SendSignal: %v", err)
	}
	select {
	case <-o.done:
	case <-ctx.Done():
		t.Fatal("PTY stream did not end after SIGKILL")
	}
	if o.end.GetExited() || !strings.Contains(o.end.GetStatus(), "killed") {
		t.Errorf("got end %v, want killed by a signal", o.end)
	}
}

func TestPTYErrors(t *testing.T) {
	if _, err := os.Stat("/dev/ptmx"); err != nil {
		t.Skipf("no /dev/ptmx here: %v", err)
	}
	d := startDaemon(t, envd.Config{AccessToken: testToken})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	bad := sh("true")
	bad.Pty = &pb.PTY{Size: &pb.PTY_Size{Cols: 0, Rows: 24}}
	if _, err := d.run(ctx, bad); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("PTY of 0 columns: got %v, want invalid_argument", err)
	}

	// A process without a PTY takes neither PTY input nor a resize.
	s, pid := d.first(ctx, sh("sleep 30"))
	defer s.Close()
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
	_, err := d.proc.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: sel,
		Input: &pb.ProcessInput{Input: &pb.ProcessInput_Pty{Pty: []byte("x")}}}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("PTY input to a process without a PTY: got %v, want failed_precondition", err)
	}
	_, err = d.proc.Update(ctx, connect.NewRequest(&pb.UpdateRequest{Process: sel,
		Pty: &pb.PTY{Size: &pb.PTY_Size{Cols: 80, Rows: 24}}}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("resize of a process without a PTY: got %v, want failed_precondition", err)
	}
	d.proc.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: sel, Signal: pb.Signal_SIGNAL_SIGKILL}))
}
