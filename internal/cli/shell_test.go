package cli

import (
	"bytes"
	"context"
	"net/http/httptest"
	"os"
	"os/user"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentenv/agentenv/client"
	"github.com/agentenv/agentenv/internal/envd"
)

// shellEnv serves an envd in-process and returns a client and sandbox whose
// envd requests reach it (envd ignores the proxy's routing headers).
func shellEnv(t *testing.T) (*client.Client, client.Sandbox, string) {
	t.Helper()
	if _, err := os.Stat("/dev/ptmx"); err != nil {
		t.Skipf("no /dev/ptmx here: %v", err)
	}
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(envd.New(envd.Config{AccessToken: "tok"}).Handler())
	t.Cleanup(srv.Close)
	return client.New("http://unused.invalid", srv.URL, "key"), client.Sandbox{SandboxID: "sb", EnvdAccessToken: "tok"}, u.Username
}

// Piped input is typed into the shell, then Ctrl+D ends it.
func TestShellPipedInput(t *testing.T) {
	c, sb, me := shellEnv(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	w.WriteString("echo out-$((40+2)); [ -t 0 ] && echo on-a-tty\n")
	w.Close()
	defer r.Close()
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	code, err := runShell(ctx, c, sb, client.PTYRequest{Cmd: "/bin/sh", Args: []string{"-i"}, User: me}, r, &out)
	if err != nil {
		t.Fatalf("runShell: %v (output %q)", err, out.String())
	}
	if code != 0 || !strings.Contains(out.String(), "out-42") || !strings.Contains(out.String(), "on-a-tty") {
		t.Errorf("got exit %d, output %q; want 0 with out-42 and on-a-tty", code, out.String())
	}
}

// From a terminal: the remote PTY gets the local size and follows its
// changes (SIGWINCH), and the exit code comes back.
func TestShellFromTerminal(t *testing.T) {
	c, sb, me := shellEnv(t)
	master, tty := openTestPTY(t, 33, 111)
	out := &syncBuffer{}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	type result struct {
		code int
		err  error
	}
	done := make(chan result, 1)
	go func() {
		code, err := runShell(ctx, c, sb, client.PTYRequest{Cmd: "/bin/sh", Args: []string{"-i"}, User: me}, tty, out)
		done <- result{code, err}
	}()
	// Typed until the shell answers: it may not read before it is up.
	typeUntil := func(line, want string) {
		t.Helper()
		for !out.has(want) {
			if ctx.Err() != nil {
				t.Fatalf("no %q in the output %q", want, out.String())
			}
			master.WriteString(line + "\r")
			time.Sleep(200 * time.Millisecond)
		}
	}
	typeUntil("echo a=$(stty size)", "a=33 111")
	if err := unix.IoctlSetWinsize(int(master.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: 44, Col: 122}); err != nil {
		t.Fatal(err)
	}
	unix.Kill(os.Getpid(), unix.SIGWINCH) // what the terminal does on a resize
	typeUntil("echo b=$(stty size)", "b=44 122")
	master.WriteString("exit 7\r")
	r := <-done
	if r.err != nil || r.code != 7 {
		t.Errorf("got exit %d, %v; want 7 (output %q)", r.code, r.err, out.String())
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (s *syncBuffer) has(sub string) bool { return strings.Contains(s.String(), sub) }

// openTestPTY stands in for the user's terminal.
func openTestPTY(t *testing.T, rows, cols uint16) (master, tty *os.File) {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { master.Close() })
	if err := unix.IoctlSetPointerInt(int(master.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(master.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.IoctlSetWinsize(int(master.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols}); err != nil {
		t.Fatal(err)
	}
	tty, err = os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tty.Close() })
	return master, tty
}
