// Package fake is a runtime.Runtime for the unprivileged test tier: a
// mock of the part (gVisor) that cannot run without root. A "sandbox" is a
// plain host process of the current user (normally envd, listening on a
// loopback address), in its own process group and working directory.
// There is no isolation at all: nothing but tests may use it.
//
// Pause is SIGSTOP of the sandbox's processes (the init process and its
// descendants: envd puts each command in its own process group), resume
// SIGCONT, destroy SIGKILL of the frozen tree. The init process starts a
// session of its own, so that a crash of the server (its parent) does not
// orphan a stopped process group, which the kernel would SIGHUP.
// It implements runtime.Pauser and runtime.Watcher; it does not implement
// runtime.Checkpointer, runtime.Preparer or runtime.Execer (a host process
// has no memory image to save, and an Exec would run on the host), so
// snapshots, fork, ready templates and warm pools are unavailable with it
// and say so through the manager's "this runtime cannot" errors.
//
// Its state is one directory per sandbox under Config.Root (the process's
// PID and start time), so that a restarted server finds, adopts and
// destroys the sandboxes of a crashed one, as with runsc's state
// directory. It must not know about templates, networking or the API.
package fake

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/runtime"
	"github.com/agentenv/agentenv/internal/runtime/pidfd"
)

// Config configures the fake runtime.
type Config struct {
	// Root holds the runtime's state, one directory per sandbox.
	Root string
	// Command returns the host command line of a spec's init process.
	// Nil runs spec.Args as they are. The process runs with spec.Env, in
	// WorkDir(spec) (created), with its output in spec.Dir/init.log.
	Command func(spec runtime.Spec) ([]string, error)
}

// Fake is the fake runtime.
type Fake struct {
	cfg Config

	mu sync.Mutex
	// exited is closed when a sandbox's process has exited (created here,
	// or adopted from the state directory on the first Exited).
	exited map[string]<-chan struct{}
}

var (
	_ runtime.Runtime = (*Fake)(nil)
	_ runtime.Pauser  = (*Fake)(nil)
	_ runtime.Watcher = (*Fake)(nil)
)

// New returns a fake runtime keeping its state in cfg.Root.
func New(cfg Config) (*Fake, error) {
	if cfg.Root == "" {
		return nil, errors.New("fake runtime: no state directory")
	}
	if err := os.MkdirAll(cfg.Root, 0o700); err != nil {
		return nil, err
	}
	return &Fake{cfg: cfg, exited: map[string]<-chan struct{}{}}, nil
}

// WorkDir is a sandbox's working directory: its whole "filesystem".
func WorkDir(spec runtime.Spec) string { return filepath.Join(spec.Dir, "root") }

// Version implements runtime.Runtime.
func (f *Fake) Version() string { return "fake" }

func (f *Fake) stateDir(id string) string { return filepath.Join(f.cfg.Root, id) }

// Create implements runtime.Runtime: it starts the init process and
// returns once the process exists.
func (f *Fake) Create(ctx context.Context, spec runtime.Spec) (err error) {
	if spec.ID == "" || strings.ContainsAny(spec.ID, "/.") {
		return fmt.Errorf("fake runtime: bad sandbox ID %q", spec.ID)
	}
	if len(spec.Lowers) > 0 {
		return errdefs.Invalid("fake runtime: sandbox %s: it does not stack layers", spec.ID)
	}
	// As a real runtime would, refuse a missing image: the suite checks
	// that a failed create leaves nothing.
	if _, err := os.Stat(spec.Image); err != nil {
		return fmt.Errorf("fake runtime: image: %w", err)
	}
	args := spec.Args
	if f.cfg.Command != nil {
		if args, err = f.cfg.Command(spec); err != nil {
			return err
		}
	}
	if len(args) == 0 {
		return errors.New("fake runtime: no init process")
	}
	st := f.stateDir(spec.ID)
	if err := os.Mkdir(st, 0o700); err != nil {
		return fmt.Errorf("fake runtime: sandbox %s: %w", spec.ID, err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(st)
		}
	}()
	wd := WorkDir(spec)
	if err := os.MkdirAll(wd, 0o700); err != nil {
		return err
	}
	log, err := os.OpenFile(filepath.Join(spec.Dir, "init.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer log.Close()
	null, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer null.Close()
	// Its own session (see the package comment). No parent-death signal:
	// sandboxes outlive a crashed server, as gVisor's do.
	p, err := os.StartProcess(args[0], args, &os.ProcAttr{
		Dir: wd, Env: spec.Env, Files: []*os.File{null, log, log},
		Sys: &syscall.SysProcAttr{Setsid: true},
	})
	if err != nil {
		return fmt.Errorf("fake runtime: start %s: %w", args[0], err)
	}
	pid := p.Pid
	done, werr := pidfd.Watch(pid, true)
	start, serr := startTime(pid)
	if err := errors.Join(werr, serr); err != nil {
		syscall.Kill(-pid, syscall.SIGKILL)
		p.Wait()
		return fmt.Errorf("fake runtime: watch %s: %w", spec.ID, err)
	}
	// The watch reaps it.
	p.Release()
	if err := os.WriteFile(filepath.Join(st, "pid"), []byte(fmt.Sprintf("%d %d\n", pid, start)), 0o600); err != nil {
		syscall.Kill(-pid, syscall.SIGKILL)
		<-done
		return err
	}
	f.mu.Lock()
	f.exited[spec.ID] = done
	f.mu.Unlock()
	return nil
}

// proc reads a sandbox's process from its state: ok is false when the
// runtime has no such sandbox; pid is 0 when its process is gone.
func (f *Fake) proc(id string) (pid int, ok bool, err error) {
	b, err := os.ReadFile(filepath.Join(f.stateDir(id), "pid"))
	if errors.Is(err, os.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	var start uint64
	if _, err := fmt.Sscanf(string(b), "%d %d", &pid, &start); err != nil {
		return 0, false, fmt.Errorf("fake runtime: state of %s: %w", id, err)
	}
	// The PID may be another process's by now.
	if got, err := startTime(pid); err != nil || got != start {
		return 0, true, nil
	}
	return pid, true, nil
}

// procState is the state letter of /proc/PID/stat ('T' stopped, 'Z'
// zombie, ...), 0 when the process is gone.
func procState(pid int) byte {
	f, err := statFields(pid)
	if err != nil || len(f) < 1 {
		return 0
	}
	return f[0][0]
}

// statFields are the fields of /proc/PID/stat after the command name.
func statFields(pid int) ([]string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	return strings.Fields(s[i+1:]), nil
}

// startTime is the process's start time in clock ticks since boot (field
// 22 of /proc/PID/stat): with the PID, it names one process.
func startTime(pid int) (uint64, error) {
	f, err := statFields(pid)
	if err != nil {
		return 0, err
	}
	if len(f) < 20 {
		return 0, fmt.Errorf("/proc/%d/stat: short", pid)
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// State implements runtime.Runtime.
func (f *Fake) State(_ context.Context, id string) (runtime.Status, error) {
	pid, ok, err := f.proc(id)
	switch {
	case err != nil:
		return "", err
	case !ok:
		return runtime.StatusUnknown, nil
	case pid == 0:
		return runtime.StatusStopped, nil
	}
	switch procState(pid) {
	case 0, 'Z', 'X':
		// Gone, or a zombie: its parent (a crashed server) never reaped it.
		return runtime.StatusStopped, nil
	case 'T', 't':
		return runtime.StatusPaused, nil
	}
	return runtime.StatusRunning, nil
}

// tree is pid and its live descendants, parents before children.
func tree(pid int) []int {
	out := []int{pid}
	for i := 0; i < len(out); i++ {
		out = append(out, children(out[i])...)
	}
	return out
}

// children are the child processes of pid, from each of its threads'
// /proc/PID/task/TID/children.
func children(pid int) []int {
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	tasks, _ := os.ReadDir(dir)
	var out []int
	for _, t := range tasks {
		b, _ := os.ReadFile(dir + "/" + t.Name() + "/children")
		for _, f := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}

func stopped(s byte) bool { return s == 'T' || s == 't' }
func dead(s byte) bool    { return s == 0 || s == 'Z' || s == 'X' }

// freeze stops pid and every descendant, again until no new process
// appears (one may fork while the tree is read).
func freeze(ctx context.Context, pid int) error {
	done := map[int]bool{}
	for {
		fresh := 0
		for _, p := range tree(pid) {
			if !done[p] {
				syscall.Kill(p, syscall.SIGSTOP)
				done[p], fresh = true, fresh+1
			}
		}
		// Delivery is asynchronous: wait for each to show stopped.
		for p := range done {
			for s := procState(p); !stopped(s) && !dead(s); s = procState(p) {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(time.Millisecond):
				}
			}
		}
		if fresh == 0 {
			return nil
		}
	}
}

func (f *Fake) running(id string) (int, error) {
	pid, ok, err := f.proc(id)
	if err != nil {
		return 0, err
	}
	if !ok || pid == 0 || dead(procState(pid)) {
		return 0, fmt.Errorf("fake runtime: sandbox %s is not running", id)
	}
	return pid, nil
}

// Pause implements runtime.Pauser: SIGSTOP of the sandbox's processes.
func (f *Fake) Pause(ctx context.Context, id string) error {
	pid, err := f.running(id)
	if err != nil {
		return err
	}
	return freeze(ctx, pid)
}

// Resume implements runtime.Pauser: SIGCONT of the sandbox's processes,
// children first, so that none runs while its parent is still stopped.
func (f *Fake) Resume(ctx context.Context, id string) error {
	pid, err := f.running(id)
	if err != nil {
		return err
	}
	t := tree(pid)
	for i := len(t) - 1; i >= 0; i-- {
		syscall.Kill(t[i], syscall.SIGCONT)
	}
	for s := procState(pid); stopped(s); s = procState(pid) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
	return nil
}

// Destroy implements runtime.Runtime: it kills the process group, waits
// for the init process to end and removes the state.
func (f *Fake) Destroy(ctx context.Context, id string) error {
	pid, ok, err := f.proc(id)
	if err != nil {
		return err
	}
	if !ok {
		return nil
	}
	if pid != 0 {
		// Frozen first: nothing forks or escapes while the tree is killed.
		if err := freeze(ctx, pid); err != nil {
			return err
		}
		// Gone means every thread of every process has exited: a killed
		// Go process's leader shows as a zombie while its other threads
		// still hold its files (envd's listening socket), and the caller
		// hands the sandbox's address to the next one once this returns.
		// A pidfd polls readable only when the whole thread group is gone.
		var gone []<-chan struct{}
		for _, p := range tree(pid) {
			if done, err := pidfd.Watch(p, false); err == nil {
				gone = append(gone, done)
			}
			syscall.Kill(p, syscall.SIGKILL)
		}
		for _, done := range gone {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-done:
			}
		}
	}
	f.mu.Lock()
	delete(f.exited, id)
	f.mu.Unlock()
	return os.RemoveAll(f.stateDir(id))
}

// List implements runtime.Runtime: every sandbox in the state directory,
// those of an earlier process included.
func (f *Fake) List(context.Context) ([]string, error) {
	entries, err := os.ReadDir(f.cfg.Root)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range entries {
		if e.IsDir() {
			ids = append(ids, e.Name())
		}
	}
	slices.Sort(ids)
	return ids, nil
}

// Exited implements runtime.Watcher.
func (f *Fake) Exited(_ context.Context, id string) (<-chan struct{}, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if done, ok := f.exited[id]; ok {
		return done, nil
	}
	pid, ok, err := f.proc(id)
	if err != nil {
		return nil, err
	}
	if !ok || pid == 0 {
		return nil, fmt.Errorf("fake runtime: sandbox %s is not running", id)
	}
	// Adopted from an earlier process: not our child, nothing to reap.
	done, err := pidfd.Watch(pid, false)
	if err != nil {
		return nil, fmt.Errorf("fake runtime: watch %s: %w", id, err)
	}
	f.exited[id] = done
	return done, nil
}
