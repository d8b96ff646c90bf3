// Package gvisorgo implements runtime.Runtime on gVisor by calling gVisor's
// own Go packages (runsc/container, runsc/sandbox) in-process instead of
// spawning the runsc CLI per operation, which costs a 48 MB Go process and a
// new control connection each time.
//
// The sandbox and gofer processes are still re-executions of the pinned
// static runsc binary (specutils.ExePath), and all state lives in runsc's
// --root layout, so `runsc --root R list/state/delete --force` work on
// sandboxes made here and this package works on sandboxes made by the CLI.
//
// The API of runsc/container is not a stable interface: every use of it stays
// in this package, which must be built against exactly the gVisor version of
// the runsc binary (New checks). It must not know about templates, networks
// or the API.
//
// Running gVisor's client code in-process has process-wide effects that the
// runsc CLI used to absorb; the embedding server must accept them:
//   - sandbox processes are children of this process: the package reaps
//     them (watch.go), and nothing else in the process may wait for
//     arbitrary children (wait4(-1)).
//   - sandbox creation is serialized process-wide (spawn.go): it swaps
//     os.Stdin/os.Stdout/os.Stderr for a moment, and with cgroups on a
//     cgroup v1 host gVisor moves this whole process into the new sandbox's
//     cgroup while it starts the sandbox process.
//   - gVisor's first sandbox start sets CLOEXEC on every open descriptor of
//     this process and raises RLIMIT_MEMLOCK to unlimited, and its log goes
//     to slog's default logger at debug level instead of stderr.
package gvisorgo

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime/debug"
	"slices"
	"strings"
	"sync"

	"gvisor.dev/gvisor/runsc/config"
	"gvisor.dev/gvisor/runsc/container"
	"gvisor.dev/gvisor/runsc/flag"

	"agentenv/internal/errdefs"
	"agentenv/internal/runtime"
	"agentenv/internal/runtime/runscbin"
)

// gvisorModule is the module whose version must match the runsc binary's;
// gvisorVersion is its version in go.mod (a test keeps the two in step).
const (
	gvisorModule  = "gvisor.dev/gvisor"
	gvisorVersion = "v0.0.0-20260905035102-160fafc42237"
)

// Config configures the runtime. It has the same fields as
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
}

// Gvisor is the in-process gVisor runtime. It is safe for concurrent use.
type Gvisor struct {
	runsc   string
	root    string
	cgroups bool
	parent  string
	version string
	// opConf is the configuration for operations on running sandboxes
	// (exec, checkpoint), which only read it. Starting a sandbox takes a
	// fresh one, as gVisor may change it from the spec's annotations.
	opConf *config.Config

	mu sync.Mutex
	// children holds the sandboxes whose processes this process started
	// (and so must reap), by ID.
	children map[string]*child
}

var (
	_ runtime.Runtime      = (*Gvisor)(nil)
	_ runtime.Pauser       = (*Gvisor)(nil)
	_ runtime.Checkpointer = (*Gvisor)(nil)
	_ runtime.Watcher      = (*Gvisor)(nil)
	_ runtime.Execer       = (*Gvisor)(nil)
)

// New checks that runsc is the build this package was compiled against and
// returns the runtime.
func New(cfg Config) (*Gvisor, error) {
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
	if err := checkBuild(path); err != nil {
		return nil, err
	}
	if err := setupProcess(path); err != nil {
		return nil, err
	}
	g := &Gvisor{runsc: path, root: cfg.Root, cgroups: cfg.Cgroups, parent: cfg.CgroupParent, children: map[string]*child{}}
	if g.opConf, err = g.conf("none"); err != nil {
		return nil, err
	}
	// The same version string as the CLI runtime's, since snapshots record it
	// and the checkpoint format is the runsc binary's, not ours.
	if g.version, err = runscbin.Version(path); err != nil {
		return nil, err
	}
	return g, nil
}

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
func (g *Gvisor) conf(network string) (*config.Config, error) {
	fs := flag.NewFlagSet("runsc", flag.ContinueOnError)
	config.RegisterFlags(fs)
	set := map[string]string{"root": g.root, "platform": "systrap", "network": network}
	if !g.cgroups {
		set["ignore-cgroups"] = "true"
	}
	for k, v := range set {
		if err := fs.Set(k, v); err != nil {
			return nil, fmt.Errorf("runsc flag --%s=%s: %w", k, v, err)
		}
	}
	return config.NewFromFlags(fs)
}

func (g *Gvisor) cgroupPath(id string) string {
	if !g.cgroups {
		return ""
	}
	return "/" + g.parent + "/" + id
}

// Create implements runtime.Runtime.
func (g *Gvisor) Create(ctx context.Context, spec runtime.Spec) (err error) {
	c, conf, err := g.prepare(ctx, spec)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			if derr := g.Destroy(context.WithoutCancel(ctx), spec.ID); derr != nil {
				err = errors.Join(err, fmt.Errorf("clean up after failed create: %w", derr))
			}
		}
	}()
	if err := c.Start(conf); err != nil {
		return fmt.Errorf("start sandbox %s: %w%s", spec.ID, err, consoleTail(spec.Dir))
	}
	return nil
}

// load returns the sandbox's root container as recorded in the state
// directory, or an ErrNotFound error. check asks the sandbox whether it still
// runs (one control RPC); without it the status is the recorded one.
func (g *Gvisor) load(id string, check bool) (*container.Container, error) {
	if err := validID(id); err != nil {
		return nil, err
	}
	c, err := container.Load(g.root, container.FullID{SandboxID: id, ContainerID: id}, container.LoadOpts{Exact: true, SkipCheck: true})
	if err != nil {
		if os.IsNotExist(err) {
			return nil, errdefs.NotFound("sandbox %s", id)
		}
		return nil, fmt.Errorf("load sandbox %s: %w", id, err)
	}
	if ch := g.child(id); ch != nil && ch.pid == c.Sandbox.Pid.Load() {
		if ch.exited() {
			// Its process is gone and reaped: never signal the recorded
			// PID, which the kernel may have given to another process.
			c.Sandbox.Pid.Store(0)
			c.GoferPid.Store(0)
			c.Status = container.Stopped
		}
		// Otherwise it runs: our reaper would have seen it exit. The root
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
	if err := c.Destroy(); err != nil {
		return fmt.Errorf("destroy sandbox %s: %w", id, err)
	}
	g.forget(id)
	return nil
}

// List implements runtime.Runtime.
func (g *Gvisor) List(ctx context.Context) ([]string, error) {
	ids, err := container.List(g.root)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", g.root, err)
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

// consoleTail returns the end of the sandbox's console log for an error
// message, or "".
func consoleTail(dir string) string {
	b, err := os.ReadFile(consolePath(dir))
	if err != nil || len(b) == 0 {
		return ""
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return ": " + strings.TrimSpace(string(b))
}
