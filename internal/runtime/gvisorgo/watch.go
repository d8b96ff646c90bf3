package gvisorgo

import (
	"context"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"agentenv/internal/errdefs"
)

// watchPid returns a channel closed when process pid exits. It waits on a
// pidfd in Go's network poller, so no thread is blocked per sandbox. With
// reap, pid must be a child of this process and is reaped once it exits.
func watchPid(pid int, reap bool) (<-chan struct{}, error) {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("pidfd of pid %d: %w", pid, err)
	}
	f := os.NewFile(uintptr(fd), fmt.Sprintf("pidfd:%d", pid))
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer f.Close()
		first := true
		// A pidfd becomes readable when the process exits; returning false
		// parks this goroutine in the poller until then.
		_ = rc.Read(func(uintptr) bool {
			if first {
				first = false
				return false
			}
			return true
		})
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

// Exited implements runtime.Watcher.
func (g *Gvisor) Exited(ctx context.Context, id string) (<-chan struct{}, error) {
	if ch := g.child(id); ch != nil && ch.done != nil {
		if ch.exited() {
			return nil, fmt.Errorf("sandbox %s is not running: %w", id, errdefs.ErrConflict)
		}
		return ch.done, nil
	}
	// A sandbox made by the CLI or by an earlier agentenv process: its
	// process is not our child, so watch it without reaping.
	c, err := g.load(id, false)
	if err != nil {
		return nil, err
	}
	pid := c.SandboxPid()
	if pid <= 0 {
		return nil, fmt.Errorf("sandbox %s has no process (status %s): %w", id, c.Status, errdefs.ErrConflict)
	}
	done, err := watchPid(pid, false)
	if err != nil {
		return nil, fmt.Errorf("watch sandbox %s: %w", id, err)
	}
	return done, nil
}
