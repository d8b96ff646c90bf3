package gvisorgo

// The server side of the workers (see worker.go): a fixed number of worker
// processes, each serving one request at a time; a request goes to any idle
// worker, creates and restores before prepares (containers made ahead of
// demand must not delay the requests they are meant to speed up). A worker
// that dies is replaced; the request it was serving fails and the runtime
// cleans up after it (Gvisor.cleanUp).

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentenv/agentenv/internal/errdefs"
)

// pool runs the workers of one runtime.
type pool struct {
	settings settings
	timeout  time.Duration
	log      *slog.Logger

	// disp hands idle workers to waiting requests.
	disp   dispatch
	closed chan struct{}

	mu      sync.Mutex
	closing bool
	procs   map[*proc]struct{} // every live worker
	wg      sync.WaitGroup     // worker watchers and restarts
}

// proc is one worker process as the server sees it.
type proc struct {
	pid  int
	cmd  *exec.Cmd
	conn *net.UnixConn
	// exited is closed once the process has exited and been reaped.
	exited chan struct{}
	// ready is set (under pool.mu) once the worker has answered the
	// settings, dead once it has exited: a worker that dies ready is
	// replaced by its watcher; one that dies before is start's failure.
	ready, dead bool
}

// startPool starts n workers and returns once each has answered.
func startPool(s settings, n int, timeout time.Duration, log *slog.Logger) (*pool, error) {
	p := &pool{settings: s, timeout: timeout, log: log, closed: make(chan struct{}), procs: map[*proc]struct{}{}}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			w, err := p.start()
			if err != nil {
				errs[i] = err
				return
			}
			p.disp.put(w)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		p.close()
		return nil, fmt.Errorf("start gVisor workers: %w", err)
	}
	return p, nil
}

// start starts one worker, sends it the settings and waits for its hello.
func (p *pool) start() (*proc, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "worker socket"), os.NewFile(uintptr(fds[1]), "worker socket")
	defer theirs.Close()
	nc, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		return nil, err
	}
	conn := nc.(*net.UnixConn)
	logR, logW, err := os.Pipe()
	if err != nil {
		conn.Close()
		return nil, err
	}
	// /proc/self/exe, not os.Executable(): the very binary this process
	// runs, even if the file was replaced since.
	cmd := exec.Command("/proc/self/exe", WorkerCommand)
	cmd.Env = append(os.Environ(), workerEnv+"=1")
	cmd.ExtraFiles = []*os.File{theirs} // workerFD
	cmd.Stderr = logW
	// Its own process group: a terminal's ^C goes to the server, which
	// stops its workers in order.
	cmd.SysProcAttr = &unix.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	logW.Close()
	if err != nil {
		conn.Close()
		logR.Close()
		return nil, err
	}
	w := &proc{pid: cmd.Process.Pid, cmd: cmd, conn: conn, exited: make(chan struct{})}
	go p.forward(w.pid, logR)
	p.mu.Lock()
	closing := p.closing
	if !closing {
		p.procs[w] = struct{}{}
		p.wg.Add(1)
	}
	p.mu.Unlock()
	if closing {
		w.kill()
		w.cmd.Wait()
		conn.Close()
		return nil, fmt.Errorf("gVisor runtime closed: %w", errdefs.ErrUnavailable)
	}
	go p.watch(w)

	var h hello
	// A program that does not call WorkerMain does not answer.
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	err = writeFrame(conn, p.settings, nil)
	if err == nil {
		_, err = readFrame(conn, &h)
	}
	conn.SetDeadline(time.Time{})
	if err != nil {
		w.kill()
		<-w.exited
		return nil, fmt.Errorf("gVisor worker %d did not start (%s): %w", w.pid, w.cmd.ProcessState, err)
	}
	p.mu.Lock()
	w.ready = !w.dead
	p.mu.Unlock()
	if !w.ready {
		return nil, fmt.Errorf("gVisor worker %d exited as it started (%s)", w.pid, w.cmd.ProcessState)
	}
	return w, nil
}

// forward logs what a worker writes to its stderr.
func (p *pool) forward(pid int, r *os.File) {
	defer r.Close()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		p.log.Warn("gVisor worker", "pid", pid, "output", sc.Text())
	}
}

// watch waits for a worker's exit and, unless the pool is closing,
// replaces it.
func (p *pool) watch(w *proc) {
	defer p.wg.Done()
	err := w.cmd.Wait()
	w.conn.Close()
	close(w.exited)
	p.mu.Lock()
	delete(p.procs, w)
	w.dead = true
	replace := w.ready && !p.closing
	p.mu.Unlock()
	if !replace {
		return
	}
	p.log.Warn("gVisor worker exited; starting another", "pid", w.pid, "status", err)
	p.wg.Add(1)
	go p.replace()
}

// replace starts a worker in place of one that died, trying again (with
// growing pauses) until it starts or the pool closes.
func (p *pool) replace() {
	defer p.wg.Done()
	delay := 100 * time.Millisecond
	for {
		w, err := p.start()
		if err == nil {
			p.disp.put(w)
			return
		}
		if errors.Is(err, errdefs.ErrUnavailable) {
			return // closed
		}
		p.log.Error("cannot start a gVisor worker; creates and restores wait for one", "err", err)
		select {
		case <-p.closed:
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, 5*time.Second)
	}
}

// errWorker marks a request whose worker died or hung: the worker did not
// clean up, the caller must.
var errWorker = errors.New("gVisor worker failed")

// errWorkerDied is an errWorker whose worker died (it did not time out):
// once cleaned up after, the request can run again in another worker.
var errWorkerDied = fmt.Errorf("%w: it died", errWorker)

// call runs req in an idle worker, waiting for one as long as ctx allows.
// Once a worker has the request, call waits for its answer (bounded by the
// pool's timeout): a create cannot be interrupted half-way. An error means
// the worker failed (errWorker) or none was available; the worker's own
// errors are in the response.
func (p *pool) call(ctx context.Context, req request) (response, *os.File, error) {
	prio := urgent
	if req.Op == opPrepare {
		prio = background
	}
	w, err := p.idleWorker(ctx, prio)
	if err != nil {
		return response{}, nil, err
	}
	var resp response
	w.conn.SetDeadline(time.Now().Add(p.timeout))
	err = writeFrame(w.conn, req, nil)
	var f *os.File
	if err == nil {
		f, err = readFrame(w.conn, &resp)
	}
	if err != nil {
		// Whatever the worker was doing is cut short: stop it, so that the
		// caller's clean-up does not race it; its watcher replaces it.
		hung := errors.Is(err, os.ErrDeadlineExceeded)
		w.kill()
		<-w.exited
		class := errWorkerDied
		if hung {
			class = errWorker
		}
		return response{}, nil, fmt.Errorf("%s of sandbox %s: %w (worker %d: %v, %s): %w",
			req.Op, req.Spec.ID, class, w.pid, err, w.cmd.ProcessState, errdefs.ErrUnavailable)
	}
	w.conn.SetDeadline(time.Time{})
	if resp.Retire {
		<-w.exited // its watcher replaces it
	} else {
		p.disp.put(w)
	}
	return resp, f, nil
}

// idleWorker waits for an idle worker that has not exited.
func (p *pool) idleWorker(ctx context.Context, prio int) (*proc, error) {
	for {
		w, err := p.disp.get(ctx, p.closed, prio)
		if err != nil {
			return nil, err
		}
		select {
		case <-w.exited:
			// died while idle; its watcher replaces it
		default:
			return w, nil
		}
	}
}

// Request priorities: urgent requests (create, restore) get the next idle
// worker before any background one (prepare).
const (
	urgent = iota
	background
	priorities
)

// dispatch hands idle workers to waiting requests, in order of priority and
// then of arrival. A worker is idle only while no request waits.
type dispatch struct {
	mu      sync.Mutex
	idle    []*proc
	waiting [priorities][]chan *proc
}

// put makes w available: to the first waiting request, or idle.
func (d *dispatch) put(w *proc) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for prio, q := range d.waiting {
		if len(q) > 0 {
			q[0] <- w // buffered: never blocks
			d.waiting[prio] = q[1:]
			return
		}
	}
	d.idle = append(d.idle, w)
}

// get returns an idle worker, waiting for one as long as ctx allows and
// the pool is open.
func (d *dispatch) get(ctx context.Context, closed <-chan struct{}, prio int) (*proc, error) {
	select {
	case <-closed:
		return nil, fmt.Errorf("gVisor runtime closed: %w", errdefs.ErrUnavailable)
	default:
	}
	d.mu.Lock()
	if n := len(d.idle); n > 0 {
		w := d.idle[n-1]
		d.idle = d.idle[:n-1]
		d.mu.Unlock()
		return w, nil
	}
	ch := make(chan *proc, 1)
	d.waiting[prio] = append(d.waiting[prio], ch)
	d.mu.Unlock()
	var err error
	select {
	case w := <-ch:
		return w, nil
	case <-ctx.Done():
		err = fmt.Errorf("waiting for a gVisor worker: %w", ctx.Err())
	case <-closed:
		err = fmt.Errorf("gVisor runtime closed: %w", errdefs.ErrUnavailable)
	}
	d.mu.Lock()
	d.waiting[prio] = slices.DeleteFunc(d.waiting[prio], func(c chan *proc) bool { return c == ch })
	d.mu.Unlock()
	// put may have handed a worker over before the request left the
	// queue: pass it on.
	select {
	case w := <-ch:
		d.put(w)
	default:
	}
	return nil, err
}

func (w *proc) kill() { _ = w.cmd.Process.Signal(unix.SIGKILL) }

// close stops every worker: each sees its socket close and exits after the
// request it is serving, if any. Workers that take more than 10s are
// killed.
func (p *pool) close() error {
	p.mu.Lock()
	if p.closing {
		p.mu.Unlock()
		return nil
	}
	p.closing = true
	close(p.closed)
	procs := make([]*proc, 0, len(p.procs))
	for w := range p.procs {
		procs = append(procs, w)
	}
	p.mu.Unlock()
	for _, w := range procs {
		w.conn.CloseWrite()
	}
	deadline := time.After(10 * time.Second)
	for _, w := range procs {
		select {
		case <-w.exited:
		case <-deadline:
			w.kill()
			<-w.exited
		}
	}
	p.wg.Wait()
	return nil
}

// workerPids returns the PIDs of the live workers.
func (p *pool) workerPids() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	var pids []int
	for w := range p.procs {
		pids = append(pids, w.pid)
	}
	return pids
}
