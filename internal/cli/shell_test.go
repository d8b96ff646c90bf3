package cli

import (
	"bytes"
	"context"
	"net/http/httptest"
	"os"
	"os/user"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"agentenv/internal/client"
	"agentenv/internal/envd"
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

// From a terminal: the remote PTY gets the local size, and the exit code
// comes back.
func TestShellFromTerminal(t *testing.T) {
	c, sb, me := shellEnv(t)
	master, tty := openTestPTY(t, 33, 111)
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	master.WriteString("echo size=$(stty size); exit 7\r")
	code, err := runShell(ctx, c, sb, client.PTYRequest{Cmd: "/bin/sh", Args: []string{"-i"}, User: me}, tty, &out)
	if err != nil {
		t.Fatalf("runShell: %v (output %q)", err, out.String())
	}
	if code != 7 || !strings.Contains(out.String(), "size=33 111") {
		t.Errorf("got exit %d, output %q; want 7 with size=33 111", code, out.String())
	}
}

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
