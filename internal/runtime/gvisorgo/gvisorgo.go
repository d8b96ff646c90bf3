// Package gvisorgo implements runtime.Runtime on gVisor by calling gVisor's
// own Go packages (runsc/container, runsc/sandbox) instead of spawning the
// runsc CLI per operation, which costs a 48 MB Go process and a new control
// connection each time.
//
// The sandbox and gofer processes are still re-executions of the pinned
// static runsc binary (specutils.ExePath), and all state lives in runsc's
// --root layout, so `runsc --root R list/state/delete --force` work on
// sandboxes made here and this package works on sandboxes made by the CLI.
//
// Two kinds of process use it:
//   - the server (the embedding process) runs the fast control calls on
//     running sandboxes: state, pause, resume, exec, checkpoint, destroy.
//     None of them touches process-wide state.
//   - long-lived workers, re-executions of the server's own binary (see
//     WorkerMain, pool.go, worker.go), create and restore sandboxes. Those
//     calls borrow their process's stdio, cgroup membership (cgroup v1),
//     namespaces and descriptor table, so each runs in a worker, one at a
//     time per worker, several workers at once. Sandbox processes are the
//     workers' children; the server watches them through pidfds.
//
// The API of runsc/container is not a stable interface: every use of it stays
// in this package, which must be built against exactly the gVisor version of
// the runsc binary (New checks). It must not know about templates, networks
// or the API.
package gvisorgo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	goruntime "runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"gvisor.dev/gvisor/runsc/config"
	"gvisor.dev/gvisor/runsc/container"
	"gvisor.dev/gvisor/runsc/flag"
	"gvisor.dev/gvisor/runsc/hostsettings"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/runtime"
	"github.com/agentenv/agentenv/internal/runtime/runscbin"
)

// gvisorModule is the module whose version must match the runsc binary's;
// gvisorVersion is its version in go.mod (a test keeps the two in step).
const (
	gvisorModule  = "gvisor.dev/gvisor"
	gvisorVersion = "v0.0.0-20260905035102-160fafc42237"
)

// Config configures the runtime. Its first fields are those of
// internal/runtime/gvisor.Config so the server can switch between the two.
type Config struct {
	// Runsc is the path of the pinned static runsc binary. The sandbox
	// processes are re-executions of it.
	Runsc string
	// Root is runsc's state directory (--root).
	Root string
	// Cgroups enables resource limits through cgroups under CgroupParent.
	// Without it, sandboxes run with --ignore-cgroups and no limits.
	Cgroups      bool
	CgroupParent string
	// Workers is the number of worker processes, i.e. how many creates and
	// restores run at once. Zero means one per CPU, at least 2.
	Workers int
	// RequestTimeout bounds one create or restore in a worker; a worker
	// that takes longer is killed and the request fails. Zero means 2m.
	RequestTimeout time.Duration
	// Log receives the workers' own diagnostics (their stderr) and their
	// restarts. Nil means slog.Default().
	Log *slog.Logger

	// testOnlyExitAfterSpawn makes workers exit right after container.New,
	// so tests can see what a worker's death in the middle of a create
	// leaves.
	testOnlyExitAfterSpawn bool
}

// settings are what the server and its workers both need to drive runsc;
// the server sends them to each worker it starts.
type settings struct {
	Runsc   string `json:"runsc"`
	Root    string `json:"root"`
	Cgroups bool   `json:"cgroups"`
	Parent  string `json:"cgroup_parent"`
	// Features are the runsc build's (runscbin.Version).
	Features runscbin.Features `json:"features"`

	TestOnlyExitAfterSpawn bool `json:"test_only_exit_after_spawn,omitempty"`
}

// Gvisor is the gVisor runtime driven through gVisor's Go packages. It is
// safe for concurrent use. Close stops its workers.
type Gvisor struct {
	settings
	version string
	// opConf is the configuration for operations on running sandboxes
	// (exec, checkpoint), which only read it. Starting a sandbox takes a
	// fresh one, as gVisor may change it from the spec's annotations.
	opConf *config.Config
	pool   *pool

	mu sync.Mutex
	// children holds the sandboxes whose processes a worker of this runtime
	// started, by ID, with a watch on their pidfd.
	children map[string]*child
}

var (
	_ runtime.Runtime      = (*Gvisor)(nil)
	_ runtime.Pauser       = (*Gvisor)(nil)
	_ runtime.Checkpointer = (*Gvisor)(nil)
	_ runtime.Watcher      = (*Gvisor)(nil)
	_ runtime.Execer       = (*Gvisor)(nil)
	_ runtime.Preparer     = (*Gvisor)(nil)
	_ io.Closer            = (*Gvisor)(nil)
)

// New checks that runsc is the build this package was compiled against,
// starts the workers and returns the runtime. The calling program must
// call WorkerMain first thing in main (and in TestMain).
func New(cfg Config) (*Gvisor, error) {
	if os.Getenv(workerEnv) != "" {
		// This process was started as a worker but its main did not call
		// WorkerMain: going on would start workers of workers.
		return nil, fmt.Errorf("gvisorgo: this program does not call gvisorgo.WorkerMain at the top of main (or TestMain): %w", errdefs.ErrUnavailable)
	}
	if cfg.Runsc == "" {
		cfg.Runsc = "runsc"
	}
	path, err := exec.LookPath(cfg.Runsc)
	if err != nil {
		return nil, fmt.Errorf("runsc not found (%s): run `make setup` to install the pinned build: %w", cfg.Runsc, errdefs.ErrUnavailable)
	}
	if cfg.Root == "" {
		return nil, errdefs.Invalid("gvisorgo: Config.Root (runsc --root) must be set")
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = "agentenv"
	}
	if err := os.MkdirAll(cfg.Root, 0o700); err != nil {
		return nil, err
	}
	if err := runscbin.MkSharedRoot(); err != nil {
		return nil, err
	}
	if err := checkBuild(path); err != nil {
		return nil, err
	}
	if err := setupProcess(path); err != nil {
		return nil, err
	}
	g := &Gvisor{
		settings: settings{Runsc: path, Root: cfg.Root, Cgroups: cfg.Cgroups, Parent: cfg.CgroupParent,
			TestOnlyExitAfterSpawn: cfg.testOnlyExitAfterSpawn},
		children: map[string]*child{},
	}
	if g.opConf, err = g.conf("none"); err != nil {
		return nil, err
	}
	check := *g.opConf
	check.HostSettings = config.HostSettingsCheckMandatory
	if err := hostsettings.Handle(&check); err != nil {
		return nil, fmt.Errorf("this host cannot run gVisor sandboxes: %w: %w", err, errdefs.ErrUnavailable)
	}
	// The same version string as the CLI runtime's, since snapshots record it
	// and the checkpoint format is the runsc binary's, not ours.
	if g.version, g.Features, err = runscbin.Version(path); err != nil {
		return nil, err
	}
	n := cfg.Workers
	if n <= 0 {
		n = max(goruntime.NumCPU(), 2)
	}
	timeout := cfg.RequestTimeout
	if timeout <= 0 {
		timeout = 2 * time.Minute
	}
	log := cfg.Log
	if log == nil {
		log = slog.Default()
	}
	if g.pool, err = startPool(g.settings, n, timeout, log); err != nil {
		return nil, err
	}
	return g, nil
}

// Close stops the workers. Sandboxes keep running (their processes are
// re-parented, as after `runsc create`) and stay usable by another
// runtime on the same state directory. Creates and restores fail after
// Close; the other calls keep working.
func (g *Gvisor) Close() error { return g.pool.close() }

// checkBuild refuses a runsc binary built from another gVisor version than
// the one linked into this process: the control protocol and state file
// format between the two are private to one version.
func checkBuild(runsc string) error {
	bin, err := readBuildModule(runsc, gvisorModule)
	if err != nil {
		return fmt.Errorf("read build info of %s: %w", runsc, err)
	}
	ours := gvisorVersion
	// Test binaries carry no dependency versions; real builds do, and a
	// go.mod upgrade without updating gvisorVersion must not pass.
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == gvisorModule {
				ours = d.Version
			}
		}
	}
	if bin != ours {
		return fmt.Errorf("%s is gVisor %s but agentenv was built with %s: install the pinned runsc (`make setup`): %w", runsc, bin, ours, errdefs.ErrUnavailable)
	}
	return nil
}

// Version implements runtime.Runtime.
func (g *Gvisor) Version() string { return g.version }

// conf returns a fresh runsc configuration, as the CLI would build it from
// its global flags (--root, --platform, --network, --ignore-cgroups).
func (s settings) conf(network string) (*config.Config, error) {
	fs := flag.NewFlagSet("runsc", flag.ContinueOnError)
	config.RegisterFlags(fs)
	// allow-suid: setuid binaries work inside (E2B's templates give user
	// passwordless sudo); the sandbox's root is still gVisor's.
	// host-settings=ignore: New checks the host's settings once; runsc's
	// default checks them at every start (a few ms of a worker's CPU).
	set := map[string]string{"root": s.Root, "shared-root": runscbin.SharedRoot, "platform": "systrap", "network": network, "allow-suid": "true",
		"host-settings": "ignore"}
	if !s.Cgroups {
		set["ignore-cgroups"] = "true"
	}
	for k, v := range set {
		if err := fs.Set(k, v); err != nil {
			return nil, fmt.Errorf("runsc flag --%s=%s: %w", k, v, err)
		}
	}
	return config.NewFromFlags(fs)
}

func (s settings) cgroupPath(id string) string {
	if !s.Cgroups {
		return ""
	}
	return "/" + s.Parent + "/" + id
}

// Create implements runtime.Runtime: a worker creates and starts the
// sandbox.
func (g *Gvisor) Create(ctx context.Context, spec runtime.Spec) error {
	return g.call(ctx, request{Op: opCreate, Spec: spec})
}

// call checks a request's spec, runs it in a worker and records the sandbox
// process the worker started.
func (g *Gvisor) call(ctx context.Context, req request) error {
	if req.Spec.ID == "" || req.Spec.Dir == "" || req.Spec.Image == "" {
		return errdefs.Invalid("runtime spec needs an ID, a directory and an image")
	}
	if err := validID(req.Spec.ID); err != nil {
		return err
	}
	resp, pidfd, err := g.pool.call(ctx, req)
	for retries := 0; errors.Is(err, errWorker); retries++ {
		// The worker died or hung: it did not clean up after itself.
		if cerr := g.cleanUp(context.WithoutCancel(ctx), req.Spec.ID); cerr != nil {
			err = errors.Join(err, fmt.Errorf("clean up after the worker: %w", cerr))
			break
		}
		// A worker killed from outside (OOM, an operator; also one that died
		// idle before its watcher saw it) fails the request it held or was
		// handed; once cleaned up after, the request runs again elsewhere,
		// at most twice. A hung worker (timeout) is not tried again.
		if retries == 2 || !errors.Is(err, errWorkerDied) || ctx.Err() != nil {
			break
		}
		g.pool.log.Warn("gVisor worker died with a request; running it again", "op", req.Op, "sandbox", req.Spec.ID, "err", err)
		resp, pidfd, err = g.pool.call(ctx, req)
	}
	if err != nil {
		return err
	}
	if err := resp.err(); err != nil {
		closeFile(pidfd)
		return err
	}
	g.watch(req.Spec.ID, resp.Pid, pidfd)
	return nil
}

// load returns the sandbox's root container as recorded in the state
// directory, or an ErrNotFound error. check asks the sandbox whether it still
// runs (one control RPC); without it the status is the recorded one.
func (g *Gvisor) load(id string, check bool) (*container.Container, error) {
	if err := validID(id); err != nil {
		return nil, err
	}
	c, err := g.loadContainer(id)
	if err != nil {
		return nil, err
	}
	if ch := g.child(id); ch != nil && ch.pid == c.Sandbox.Pid.Load() {
		if ch.exited() {
			// Its process is gone (and reaped by its worker): never signal
			// the recorded PID, which the kernel may have given to another
			// process.
			c.Sandbox.Pid.Store(0)
			c.GoferPid.Store(0)
			c.Status = container.Stopped
		}
		// Otherwise it runs: its pidfd would have said so. The root
		// container's end ends the sandbox process, so no RPC is needed
		// (it costs milliseconds while the sandbox is busy starting).
		return c, nil
	}
	if check && (c.Status == container.Created || c.Status == container.Running) {
		c.CheckStopped()
	}
	return c, nil
}

// validID accepts the IDs runsc accepts (letters, digits, "+", ".", "-"),
// except "_", which runsc's state file names use as a separator. Checking
// it first also keeps IDs from naming paths outside the state directory and
// our cgroups.
func validID(id string) error {
	if id == "" || strings.HasPrefix(id, ".") || strings.IndexFunc(id, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '+' || r == '.' || r == '-')
	}) >= 0 {
		return errdefs.Invalid("sandbox id %q: use letters, digits, '+', '.' and '-'", id)
	}
	return nil
}

// State implements runtime.Runtime.
func (g *Gvisor) State(ctx context.Context, id string) (runtime.Status, error) {
	if validID(id) != nil {
		return runtime.StatusUnknown, nil // no such sandbox can exist
	}
	c, err := g.load(id, true)
	if errors.Is(err, errdefs.ErrNotFound) {
		return runtime.StatusUnknown, nil
	}
	if err != nil {
		return "", err
	}
	switch c.Status {
	case container.Running:
		return runtime.StatusRunning, nil
	case container.Paused:
		return runtime.StatusPaused, nil
	default:
		return runtime.StatusStopped, nil
	}
}

// Destroy implements runtime.Runtime. Like `runsc delete --force`, it kills
// the sandbox and gofer, removes the cgroups and the state files.
func (g *Gvisor) Destroy(ctx context.Context, id string) error {
	if validID(id) != nil {
		return nil // no such sandbox can exist
	}
	c, err := g.load(id, false)
	if errors.Is(err, errdefs.ErrNotFound) {
		g.forget(id)
		// A create that failed early may have left empty cgroups.
		return g.removeCgroups(id)
	}
	if err != nil {
		return err
	}
	derr := c.Destroy()
	// gVisor removes the container's state even when removing its cgroups
	// failed ("device or resource busy" while a task lingers), and stops
	// retrying the other controllers at the first failure: remove them
	// all here, killing what is left inside, so one Destroy frees them.
	cerr := g.removeCgroups(id)
	if derr != nil && (cerr != nil || g.cgroupPath(id) == "") {
		return fmt.Errorf("destroy sandbox %s: %w", id, errors.Join(derr, cerr))
	}
	g.forget(id)
	return cerr
}

// List implements runtime.Runtime.
func (g *Gvisor) List(ctx context.Context) ([]string, error) {
	ids, err := container.List(g.Root)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", g.Root, err)
	}
	out := make([]string, 0, len(ids))
	for _, id := range ids {
		if !slices.Contains(out, id.ContainerID) {
			out = append(out, id.ContainerID)
		}
	}
	return out, nil
}

// Pause implements runtime.Pauser. The container methods keep the state file
// (and so `runsc list`) in step; they cost one control connection each.
func (g *Gvisor) Pause(ctx context.Context, id string) error {
	c, err := g.load(id, false)
	if err != nil {
		return err
	}
	if err := c.Pause(); err != nil {
		return fmt.Errorf("pause sandbox %s: %w", id, err)
	}
	return nil
}

// Resume implements runtime.Pauser.
func (g *Gvisor) Resume(ctx context.Context, id string) error {
	c, err := g.load(id, false)
	if err != nil {
		return err
	}
	if err := c.Resume(); err != nil {
		return fmt.Errorf("resume sandbox %s: %w", id, err)
	}
	return nil
}

var _ runtime.LayerStacker = (*Gvisor)(nil)

// StacksLayers says whether the runsc build stacks images (patch 0008).
func (g *Gvisor) StacksLayers() bool { return g.Features.RootfsLowerImages }
