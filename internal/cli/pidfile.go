package cli

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentenv/agentenv/internal/runtime/gvisorgo"
	"github.com/agentenv/agentenv/internal/runtime/pidfd"
)

// `agentenv serve` records its PID in <data-dir>/serve.pid so that
// `agentenv serve --stop` stops exactly that server (and nothing else a
// pattern such as `pkill -f 'agentenv serve'` would also hit).

const pidFileName = "serve.pid"

func pidFilePath(dataDir string) string { return filepath.Join(dataDir, pidFileName) }

// claimPidFile writes this process's PID into dataDir's pid file. It
// refuses when a live agentenv serve already holds it. The returned
// function removes the file if it still names this process.
func claimPidFile(dataDir string) (release func(), err error) {
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return nil, err
	}
	path := pidFilePath(dataDir)
	for range 2 {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if errors.Is(err, os.ErrExist) {
			if pid, err := readPid(path); err == nil && isServe(pid) {
				return nil, fmt.Errorf("agentenv serve (pid %d) already runs with data dir %s: stop it with `agentenv serve --stop --data-dir %s`, or give this one another --data-dir", pid, dataDir, dataDir)
			}
			os.Remove(path) // left by a server that did not exit cleanly
			continue
		}
		if err != nil {
			return nil, err
		}
		_, err = fmt.Fprintf(f, "%d\n", os.Getpid())
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(path)
			return nil, err
		}
		return func() {
			if pid, err := readPid(path); err == nil && pid == os.Getpid() {
				os.Remove(path)
			}
		}, nil
	}
	return nil, fmt.Errorf("%s keeps reappearing: is another agentenv serve starting with data dir %s?", path, dataDir)
}

func readPid(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return 0, fmt.Errorf("%s does not hold a process ID (%q)", path, bytes.TrimSpace(b))
	}
	return pid, nil
}

// isServe reports whether process pid is an agentenv serve: its command
// line names an agentenv binary and the serve command, and it is not one of
// the gVisor workers (re-executions of the same binary).
func isServe(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	argv := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	if len(argv) < 2 || !strings.HasPrefix(filepath.Base(argv[0]), "agentenv") || argv[1] == gvisorgo.WorkerCommand {
		return false
	}
	for _, a := range argv[1:] {
		if a == "serve" {
			return true
		}
	}
	return false
}

// stopServer stops the agentenv serve recorded in dataDir's pid file:
// SIGTERM, then wait until it has exited (it stops its sandboxes first).
func stopServer(out io.Writer, dataDir string, wait time.Duration) error {
	path := pidFilePath(dataDir)
	pid, err := readPid(path)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("no agentenv serve is recorded in %s: none is running with data dir %s (or it was started with another --data-dir)", path, dataDir)
	}
	if err != nil {
		return err
	}
	// The pidfd names this very process from here on: if it exits and its
	// PID is reused, the signal below fails instead of reaching another.
	pf, err := pidfd.Open(pid)
	if errors.Is(err, unix.ESRCH) || (err == nil && !isServe(pid)) {
		if pf != nil {
			pf.Close()
		}
		os.Remove(path)
		fmt.Fprintf(out, "agentenv serve (pid %d) is not running; removed the stale %s\n", pid, path)
		return nil
	}
	if err != nil {
		return err
	}
	defer pf.Close()
	if err := unix.PidfdSendSignal(int(pf.Fd()), unix.SIGTERM, nil, 0); err != nil {
		if errors.Is(err, unix.ESRCH) {
			fmt.Fprintf(out, "agentenv serve (pid %d) had already exited\n", pid)
			return nil
		}
		return fmt.Errorf("signal agentenv serve (pid %d): %w", pid, err)
	}
	fmt.Fprintf(out, "stopping agentenv serve (pid %d)...\n", pid)
	fds := []unix.PollFd{{Fd: int32(pf.Fd()), Events: unix.POLLIN}}
	deadline := time.Now().Add(wait)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("agentenv serve (pid %d) is still running %v after SIGTERM (it stops its sandboxes first; see its log), run --stop again to keep waiting", pid, wait)
		}
		n, err := unix.Poll(fds, int(left.Milliseconds())+1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if n > 0 {
			fmt.Fprintf(out, "agentenv serve (pid %d) stopped\n", pid)
			return nil
		}
	}
}
