package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"agentenv/internal/runtime"
)

var _ runtime.Watcher = (*Gvisor)(nil)

// Exited implements runtime.Watcher with a pidfd of the sandbox process,
// waited on by Go's network poller (no thread blocked per sandbox).
func (g *Gvisor) Exited(ctx context.Context, id string) (<-chan struct{}, error) {
	out, err := g.run(ctx, "state", id)
	if err != nil {
		return nil, err
	}
	var st struct {
		Pid    int    `json:"pid"`
		Status string `json:"status"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return nil, fmt.Errorf("runsc state %s: %w", id, err)
	}
	if st.Pid <= 0 {
		return nil, fmt.Errorf("sandbox %s has no process (status %s)", id, st.Status)
	}
	fd, err := unix.PidfdOpen(st.Pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("pidfd of sandbox %s (pid %d): %w", id, st.Pid, err)
	}
	f := os.NewFile(uintptr(fd), fmt.Sprintf("pidfd:%d", st.Pid))
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
		err := rc.Read(func(uintptr) bool {
			if first {
				first = false
				return false
			}
			return true
		})
		if err != nil && !errors.Is(err, os.ErrClosed) {
			return
		}
	}()
	return done, nil
}
