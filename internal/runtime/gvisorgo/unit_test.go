package gvisorgo

// Tests here need neither root nor gVisor.

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/runtime"
	"github.com/agentenv/agentenv/internal/runtime/pidfd"
	"github.com/agentenv/agentenv/internal/testenv"
)

// TestPinnedVersion keeps gvisorVersion (checked against the runsc binary at
// run time) equal to the gVisor version in go.mod.
func TestPinnedVersion(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "require" {
			f = f[1:]
		}
		if len(f) >= 2 && f[0] == gvisorModule {
			if got, want := gvisorVersion, f[1]; got != want {
				t.Errorf("gvisorgo pins gVisor %s, go.mod requires %s: change both together", got, want)
			}
			return
		}
	}
	t.Errorf("go.mod does not require %s", gvisorModule)
}

func TestValidID(t *testing.T) {
	for _, tc := range []struct {
		id   string
		want bool
	}{
		{"rtt00000112345678901", true},
		{"a.b+c-D9", true},
		{"", false},
		{".", false},
		{"..", false},
		{"../x", false},
		{"a/b", false},
		{"a_b", false},
		{"a:b", false},
		{"a b", false},
	} {
		if got := validID(tc.id) == nil; got != tc.want {
			t.Errorf("validID(%q) ok = %v, want %v", tc.id, got, tc.want)
		}
	}
}

// TestFrames sends requests and responses over a socketpair as the server
// and a worker do: large frames arrive whole, a pidfd arrives with its
// response, and errors keep their errdefs class.
func TestFrames(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "socket")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c.(*net.UnixConn)
	}
	server, worker := conn(fds[0]), conn(fds[1])

	big := request{Op: opCreate, Spec: runtime.Spec{ID: "x", Env: []string{strings.Repeat("A", 1<<20)}}}
	go writeFrame(server, big, nil)
	var got request
	if f, err := readFrame(worker, &got); err != nil || f != nil {
		t.Fatalf("read request: file %v, err %v", f, err)
	}
	if got.Op != big.Op || len(got.Spec.Env) != 1 || got.Spec.Env[0] != big.Spec.Env[0] {
		t.Errorf("request changed on the way: op %q, %d env entries", got.Op, len(got.Spec.Env))
	}

	pfd, err := pidfd.Open(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		writeFrame(worker, response{Pid: os.Getpid()}, pfd)
		pfd.Close()
		writeFrame(worker, errorResponse(errdefs.Conflict("sandbox x exists")), nil)
	}()
	var resp response
	f, err := readFrame(server, &resp)
	if err != nil || f == nil || resp.Pid != os.Getpid() {
		t.Fatalf("read response: pid %d, file %v, err %v", resp.Pid, f, err)
	}
	var info unix.Siginfo
	// A pidfd of this process: waiting on it must say "not a child", not
	// "bad descriptor".
	if err := unix.Waitid(unix.P_PIDFD, int(f.Fd()), &info, unix.WEXITED|unix.WNOHANG, nil); !errors.Is(err, unix.ECHILD) {
		t.Errorf("waitid on the received pidfd: %v, want ECHILD", err)
	}
	f.Close()
	if _, err := readFrame(server, &resp); err != nil {
		t.Fatal(err)
	}
	if err := resp.err(); !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "sandbox x exists") {
		t.Errorf("error over the socket: %v, want the conflict", err)
	}

	worker.Close()
	if _, err := readFrame(server, &resp); !errors.Is(err, io.EOF) {
		t.Errorf("read after the peer closed: %v, want EOF", err)
	}
}

// TestNewInWorkerRefused: a program started as a worker that does not call
// WorkerMain must not start workers of its own.
func TestNewInWorkerRefused(t *testing.T) {
	t.Setenv(workerEnv, "1")
	if _, err := New(Config{Runsc: "/bin/true", Root: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "WorkerMain") {
		t.Errorf("New in a worker's environment: %v, want a refusal naming WorkerMain", err)
	}
}

// A worker's error keeps its message and every errdefs class across the
// socket, as the service's other transports do.
func TestWorkerErrorKeepsClass(t *testing.T) {
	for _, class := range []error{
		errdefs.ErrNotFound, errdefs.ErrInvalid, errdefs.ErrConflict,
		errdefs.ErrPermissionDenied, errdefs.ErrTooLarge, errdefs.ErrInsufficientStorage,
		errdefs.ErrResourceExhausted, errdefs.ErrUnavailable,
	} {
		sent := fmt.Errorf("restore: %w", class)
		got := errorResponse(sent).err()
		if got == nil || got.Error() != sent.Error() || !errors.Is(got, class) {
			t.Errorf("%v came back as %v (is %v: %v)", sent, got, class, errors.Is(got, class))
		}
	}
	if got := errorResponse(errors.New("disk on fire")).err(); got == nil || errdefs.Classified(got) {
		t.Errorf("an unclassified error came back as %v, classified %v", got, errdefs.Classified(got))
	}
	if (response{}).err() != nil {
		t.Error("a response without an error has one")
	}
}
