// Package pidfd watches host processes for their exit through pidfds parked
// in Go's network poller, so that no thread is blocked per watched process.
// Both gVisor drivers use it to notice a sandbox that dies on its own. It
// must not do anything else.
package pidfd

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Watch returns a channel closed when process pid exits. It waits on a
// pidfd in Go's network poller, so no thread is blocked per sandbox. With
// reap, pid must be a child of this process and is reaped once it exits.
func Watch(pid int, reap bool) (<-chan struct{}, error) {
	f, err := Open(pid)
	if err != nil {
		return nil, err
	}
	return WatchFile(f, reap)
}

// Open returns a pidfd of process pid, non-blocking (as WatchFile needs it)
// and close-on-exec.
func Open(pid int) (*os.File, error) {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("pidfd of pid %d: %w", pid, err)
	}
	return os.NewFile(uintptr(fd), fmt.Sprintf("pidfd:%d", pid)), nil
}

// WatchFile is Watch on a pidfd opened elsewhere (by Open, possibly in
// another process that passed it over a unix socket: a pidfd names its
// process for good, so unlike a PID it cannot name another process once
// the first is reaped). It takes ownership of f. With reap, the process is
// reaped if it is a child of this process by the time it exits.
func WatchFile(f *os.File, reap bool) (<-chan struct{}, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer f.Close()
		// A pidfd becomes readable when the process exits; returning false
		// parks this goroutine in the poller until then. Ask the pidfd
		// itself each time: the poller's edge-triggered wake-up is lost
		// when the process exited before this goroutine began to wait.
		_ = rc.Read(exited)
		if reap {
			_ = rc.Control(func(fd uintptr) {
				var info unix.Siginfo
				for {
					err := unix.Waitid(unix.P_PIDFD, int(fd), &info, unix.WEXITED|unix.WNOHANG, nil)
					if err != unix.EINTR {
						return
					}
				}
			})
		}
	}()
	return done, nil
}

// exited reports whether the process of a pidfd has exited, without
// blocking (on an error, no: the poller then wakes the watch).
func exited(fd uintptr) bool {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 0)
		if err == unix.EINTR {
			continue
		}
		return err == nil && n > 0
	}
}
