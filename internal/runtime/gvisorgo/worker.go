package gvisorgo

// The worker side: a re-execution of the server's binary that creates and
// restores sandboxes, one request at a time, in its own process.
//
// Why a process of its own: gVisor's create borrows process-wide state.
//   - stdio: container.New hands os.Stdin/os.Stdout/os.Stderr to the sandbox
//     as the application's stdio; the worker lends them for one call.
//   - cgroups: on a cgroup v1 host, gVisor moves the whole calling process
//     into the new sandbox's cgroups while it starts the sandbox process.
//   - namespaces: gVisor joins the sandbox's network namespace on a locked
//     thread and restores "the process's" namespace, read from
//     /proc/self/ns/net (the main thread's); nothing else in a worker
//     changes namespaces.
//   - the descriptor table: gVisor creates the sandbox's control socket
//     without SOCK_CLOEXEC (pkg/unet.socket), after it has set CLOEXEC on
//     every descriptor (SetCloExeOnAllFDs, once per process). The socket
//     leaks into the sandbox process at its number in the caller, and the
//     sandbox's loader moves the application's stdio to the fixed numbers
//     253-255 (boot.startingStdioFD), refusing if one is taken: "unable to
//     remap stdios, FD 253 is already in use", exit 128, seen by the caller
//     as "cannot read client sync file: EOF". It happened whenever the
//     caller's lowest free descriptor was 246-248, i.e. in a server holding
//     ~250 files (~234 running sandboxes). A worker keeps its descriptor
//     table small and holds 253-255 itself (close-on-exec), so no leaked
//     descriptor can ever land there.
//
// Sandbox processes are the worker's children: it reaps them (reaper) and
// hands the server a pidfd of each, so that the server watches them without
// racing a reaped PID's reuse. When a worker dies, its sandboxes keep
// running, re-parented like those of `runsc create`.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"runtime/pprof"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/runsc/config"
	"gvisor.dev/gvisor/runsc/container"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/runtime"
	"github.com/agentenv/agentenv/internal/runtime/pidfd"
)

// WorkerCommand is the first argument that makes the program a worker.
const WorkerCommand = "__gvisor-worker"

// workerEnv marks a worker's environment, so that a program that forgot to
// call WorkerMain fails instead of starting workers of its own.
const workerEnv = "AGENTENV_GVISOR_WORKER"

// workerFD is the worker's end of the socketpair (ExtraFiles[0]).
const workerFD = 3

// WorkerMain makes this process a worker of the gvisorgo runtime if it was
// started as one (os.Args[1] == WorkerCommand): it serves the runtime that
// started it and exits. Otherwise it returns at once. Call it first thing in
// main, and in TestMain of tests that start a gvisorgo runtime.
func WorkerMain() {
	if len(os.Args) < 2 || os.Args[1] != WorkerCommand || os.Getenv(workerEnv) == "" {
		return
	}
	if path := os.Getenv("AGENTENV_CPU_PROFILE"); path != "" {
		// The server's profile variable (docs/benchmarks.md): each worker
		// writes its own, when the runtime closes it.
		if f, err := os.Create(fmt.Sprintf("%s.worker.%d", path, os.Getpid())); err == nil && pprof.StartCPUProfile(f) == nil {
			defer f.Close()
			defer pprof.StopCPUProfile()
		}
	}
	if err := serveWorker(); err != nil {
		fmt.Fprintf(os.Stderr, "gvisor worker: %v\n", err)
		os.Exit(1)
	}
	pprof.StopCPUProfile()
	os.Exit(0)
}

// worker serves one runtime's requests.
type worker struct {
	settings
	reaper *reaper
}

func serveWorker() error {
	f := os.NewFile(workerFD, "worker socket")
	nc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("socket on fd %d: %w", workerFD, err)
	}
	conn, ok := nc.(*net.UnixConn)
	if !ok {
		return fmt.Errorf("fd %d is not a unix socket", workerFD)
	}
	defer conn.Close()
	var s settings
	if _, err := readFrame(conn, &s); err != nil {
		return fmt.Errorf("read settings: %w", err)
	}
	if err := setupProcess(s.Runsc); err != nil {
		return err
	}
	if err := reserveStdioFDs(); err != nil {
		return err
	}
	w := &worker{settings: s, reaper: newReaper()}
	go w.reaper.run()
	home, _ := os.ReadFile("/proc/self/cgroup")
	if err := writeFrame(conn, hello{Pid: os.Getpid()}, nil); err != nil {
		return err
	}
	for {
		var req request
		if _, err := readFrame(conn, &req); err != nil {
			if errors.Is(err, io.EOF) {
				return nil // the runtime closed or its process ended
			}
			return fmt.Errorf("read request: %w", err)
		}
		resp, pfd := w.handle(req)
		// On cgroup v1 gVisor moves this process through each new
		// sandbox's cgroups and only logs a failure to move back: a worker
		// left there would be killed with that sandbox and keep its
		// cgroups busy. Exit after answering; the pool starts a fresh one.
		now, _ := os.ReadFile("/proc/self/cgroup")
		resp.Retire = string(now) != string(home)
		err := writeFrame(conn, resp, pfd)
		closeFile(pfd)
		if err != nil {
			return fmt.Errorf("write response: %w", err)
		}
		if resp.Retire {
			return fmt.Errorf("worker left in a sandbox's cgroups after %s %s:\n%s", req.Op, req.Spec.ID, now)
		}
	}
}

// handle runs one request. On success the response names the sandbox
// process, and the file is a pidfd of it.
func (w *worker) handle(req request) (response, *os.File) {
	ctx := context.Background()
	var (
		c   *container.Container
		err error
	)
	switch req.Op {
	case opCreate:
		c, err = w.create(ctx, req.Spec)
	case opPrepare:
		c, _, err = w.prepare(ctx, req.Spec)
		if err == nil && w.TestOnlyExitAfterSpawn {
			os.Exit(3)
		}
	case opRestore:
		c, err = w.restore(ctx, req.Spec, req.Image)
	default:
		err = errdefs.Invalid("unknown worker operation %q", req.Op)
	}
	if err != nil {
		return errorResponse(err), nil
	}
	pid := c.Sandbox.Pid.Load()
	// Open the pidfd before the reaper knows the PID: until then the
	// process cannot be reaped, so the pidfd names it even if it died.
	f, err := pidfd.Open(pid)
	if err != nil {
		return errorResponse(fmt.Errorf("sandbox %s process %d: %w", req.Spec.ID, pid, err)), nil
	}
	w.reaper.add(pid)
	if gp := c.GoferPid.Load(); gp > 0 {
		w.reaper.add(gp)
	}
	return response{Pid: pid}, f
}

// create creates and starts spec's sandbox. On error nothing is left.
func (w *worker) create(ctx context.Context, spec runtime.Spec) (*container.Container, error) {
	c, conf, err := w.prepare(ctx, spec)
	if err != nil {
		return nil, err
	}
	if w.TestOnlyExitAfterSpawn {
		os.Exit(3)
	}
	if err := c.Start(conf); err != nil {
		err = fmt.Errorf("start sandbox %s: %w%s", spec.ID, err, logTails(spec.Dir))
		return nil, errors.Join(err, w.destroy(c))
	}
	return c, nil
}

// restore restores the checkpoint in dir into spec's prepared sandbox, or
// into a new one. On error nothing of the sandbox is left.
func (w *worker) restore(ctx context.Context, spec runtime.Spec, dir string) (*container.Container, error) {
	c, conf, err := w.created(ctx, spec)
	if err != nil {
		return nil, err
	}
	if w.TestOnlyExitAfterSpawn {
		os.Exit(3)
	}
	// background: the sandbox runs as soon as its kernel state is loaded,
	// while its memory pages load behind it (a page touched first waits for
	// its load). A restore of 128 MiB of dirty memory until a command runs:
	// 369 ms without, 167 ms with. The sandbox keeps its own descriptors of
	// the checkpoint files, so the caller may remove them at once.
	if err := c.Restore(conf, dir, false /* direct */, true /* background */, nil /* networkArgs: scrape the netns again */); err != nil {
		err = fmt.Errorf("restore %s from %s: %w%s", spec.ID, dir, err, logTails(spec.Dir))
		return nil, errors.Join(err, w.destroy(c))
	}
	return c, nil
}

// created returns spec's sandbox in the Created state: the one Prepare made,
// or a new one.
func (w *worker) created(ctx context.Context, spec runtime.Spec) (*container.Container, *config.Config, error) {
	c, err := w.loadContainer(spec.ID)
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		return w.prepare(ctx, spec)
	case err != nil:
		return nil, nil, err
	case c.Status != container.Created:
		return nil, nil, errdefs.Conflict("sandbox %s exists and is %s", spec.ID, c.Status)
	}
	conf, err := w.startConf(spec)
	if err != nil {
		return nil, nil, err
	}
	return c, conf, nil
}

// destroy removes a sandbox whose create or restore failed. For a sandbox
// this worker has just spawned, gVisor waits for (reaps) the process itself.
func (w *worker) destroy(c *container.Container) error {
	err := c.Destroy()
	if cerr := w.removeCgroups(c.ID); cerr != nil {
		err = errors.Join(err, cerr)
	}
	if err != nil {
		return fmt.Errorf("clean up sandbox %s: %w", c.ID, err)
	}
	return nil
}

// loadContainer returns the sandbox's root container from the state
// directory, or an ErrNotFound error.
func (s settings) loadContainer(id string) (*container.Container, error) {
	c, err := container.Load(s.Root, container.FullID{SandboxID: id, ContainerID: id}, container.LoadOpts{Exact: true, SkipCheck: true})
	if err != nil {
		if os.IsNotExist(err) {
			return nil, errdefs.NotFound("sandbox %s", id)
		}
		return nil, fmt.Errorf("load sandbox %s: %w", id, err)
	}
	return c, nil
}

// reserveStdioFDs occupies the descriptor numbers that sandbox processes
// move the application's stdio to (253-255) with close-on-exec copies of
// /dev/null, so that no descriptor gVisor leaks into a sandbox process can
// have one of those numbers (see the top of this file).
func reserveStdioFDs() error {
	null, err := unix.Open(os.DevNull, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(null)
	for fd := 253; fd <= 255; fd++ {
		if err := unix.Dup3(null, fd, unix.O_CLOEXEC); err != nil {
			return fmt.Errorf("reserve descriptor %d: %w", fd, err)
		}
	}
	return nil
}

// reaper reaps the worker's sandbox processes once they exit. It waits for
// each known PID only: gVisor waits for the other children (hooks, a
// sandbox whose create failed) itself.
type reaper struct {
	mu   sync.Mutex
	pids map[int]struct{}
}

func newReaper() *reaper { return &reaper{pids: map[int]struct{}{}} }

func (r *reaper) add(pid int) {
	r.mu.Lock()
	r.pids[pid] = struct{}{}
	r.mu.Unlock()
}

// run reaps on every SIGCHLD, and every few seconds in case a signal was
// missed (signals coalesce).
func (r *reaper) run() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, unix.SIGCHLD)
	tick := time.NewTicker(5 * time.Second)
	for {
		select {
		case <-sig:
		case <-tick.C:
		}
		r.reap()
	}
}

func (r *reaper) reap() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for pid := range r.pids {
		var ws unix.WaitStatus
		got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
		if got == pid || errors.Is(err, unix.ECHILD) {
			delete(r.pids, pid)
		}
	}
}
