package gvisorgo

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/runtime/pidfd"
)

// child is a sandbox whose process a worker of this runtime started.
type child struct {
	pid int
	// done is closed once the sandbox process has exited.
	done <-chan struct{}
}

func (c *child) exited() bool {
	if c.done == nil {
		return false
	}
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// watch records the sandbox process a worker started for id, through the
// pidfd the worker sent (f, owned here).
func (g *Gvisor) watch(id string, pid int, f *os.File) {
	if ch := g.child(id); ch != nil && ch.pid == pid && ch.done != nil && !ch.exited() {
		// Restored into a sandbox Prepare made: already watched.
		closeFile(f)
		return
	}
	ch := &child{pid: pid}
	if f != nil {
		// Not reaped here: the worker that started it reaps it.
		if done, err := pidfd.WatchFile(f, false); err == nil {
			ch.done = done
		}
	}
	g.mu.Lock()
	g.children[id] = ch
	g.mu.Unlock()
}

func (g *Gvisor) child(id string) *child {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.children[id]
}

func (g *Gvisor) forget(id string) {
	g.mu.Lock()
	delete(g.children, id)
	g.mu.Unlock()
}

// Exited implements runtime.Watcher.
func (g *Gvisor) Exited(ctx context.Context, id string) (<-chan struct{}, error) {
	if ch := g.child(id); ch != nil && ch.done != nil {
		if ch.exited() {
			return nil, fmt.Errorf("sandbox %s is not running: %w", id, errdefs.ErrConflict)
		}
		return ch.done, nil
	}
	// A sandbox made by the CLI or by an earlier agentenv process: watch
	// its process by PID.
	c, err := g.load(id, false)
	if err != nil {
		return nil, err
	}
	pid := c.SandboxPid()
	if pid <= 0 {
		return nil, fmt.Errorf("sandbox %s has no process (status %s): %w", id, c.Status, errdefs.ErrConflict)
	}
	done, err := pidfd.Watch(pid, false)
	if err != nil {
		return nil, fmt.Errorf("watch sandbox %s: %w", id, err)
	}
	return done, nil
}

// cleanUp removes what a worker that died or hung in the middle of a
// create or restore of id may have left: the container (state, process,
// cgroups) and, before the state was written, a sandbox process known only
// by its command line.
func (g *Gvisor) cleanUp(ctx context.Context, id string) error {
	killSandboxProcesses(g.Runsc, id)
	return g.Destroy(ctx, id)
}

// killSandboxProcesses kills the runsc processes (sandbox, gofer) whose
// last argument is the container ID id, as runsc starts them.
func killSandboxProcesses(runsc, id string) {
	for pid := range sandboxProcesses(runsc, id) {
		unix.Kill(pid, unix.SIGKILL)
	}
}

// sandboxProcesses returns the command lines, by PID, of the processes of
// the runsc binary whose last argument is the container ID id.
func sandboxProcesses(runsc, id string) map[int][]string {
	if p, err := filepath.EvalSymlinks(runsc); err == nil {
		runsc = p
	}
	found := map[int][]string{}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(args) < 2 || args[len(args)-1] != id {
			continue
		}
		dir := filepath.Dir(p)
		if exe, err := os.Readlink(filepath.Join(dir, "exe")); err != nil || strings.TrimSuffix(exe, " (deleted)") != runsc {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(dir)); err == nil {
			found[pid] = args
		}
	}
	return found
}
