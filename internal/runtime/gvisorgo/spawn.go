package gvisorgo

import (
	"agentenv/internal/childproc"
	"agentenv/internal/runtime/pidfd"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"gvisor.dev/gvisor/runsc/config"
	"gvisor.dev/gvisor/runsc/container"
	"gvisor.dev/gvisor/runsc/specutils"

	"agentenv/internal/errdefs"
	"agentenv/internal/runtime"
	"agentenv/internal/runtime/ocispec"
)

// spawnMu serializes container.New across the whole process, for three
// reasons that are all process-wide:
//   - container.New hands os.Stdin/os.Stdout/os.Stderr to the sandbox as the
//     application's stdio; we swap them for /dev/null and the sandbox's
//     console log while it runs (see spawn).
//   - with cgroups on a cgroup v1 host, gVisor moves the calling process
//     (all of it, not one thread) into the sandbox's cgroup to start the
//     sandbox and moves it back afterwards; two at once would start
//     sandboxes in each other's cgroups.
//   - 1 in ~320 concurrent in-process container.New calls failed in the
//     spike with "cannot read client sync file ... EOF".
var spawnMu sync.Mutex

// maxSpawnAttempts bounds the retries of container.New after the sandbox
// process died before signalling that it had booted.
const maxSpawnAttempts = 3

func consolePath(dir string) string { return filepath.Join(dir, "console.log") }

// network is runsc's --network for spec: a sandbox without a network
// namespace gets no network at all.
func network(spec runtime.Spec) string {
	if spec.NetNS == "" {
		return "none"
	}
	return "sandbox"
}

// prepare writes the bundle for spec and creates its sandbox process (the
// container is in the Created state, as after `runsc create`). On error
// nothing of the sandbox is left behind.
func (g *Gvisor) prepare(ctx context.Context, spec runtime.Spec) (*container.Container, *config.Config, error) {
	if spec.ID == "" || spec.Dir == "" || spec.Image == "" {
		return nil, nil, errdefs.Invalid("runtime spec needs an ID, a directory and an image")
	}
	if err := validID(spec.ID); err != nil {
		return nil, nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	if _, err := g.load(spec.ID, false); err == nil {
		return nil, nil, errdefs.Conflict("sandbox %s already exists", spec.ID)
	}
	bundle, err := ocispec.WriteBundle(spec, g.cgroupPath(spec.ID))
	if err != nil {
		return nil, nil, fmt.Errorf("write bundle: %w", err)
	}
	conf, err := g.conf(network(spec))
	if err != nil {
		return nil, nil, err
	}
	// The sandbox writes the application's output at its own offsets:
	// O_APPEND keeps it from clobbering other writers of the log.
	console, err := os.OpenFile(consolePath(spec.Dir), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, nil, err
	}
	defer console.Close()
	c, err := g.spawn(conf, spec.ID, bundle, console)
	if err != nil {
		err = fmt.Errorf("create sandbox %s: %w%s", spec.ID, err, consoleTail(spec.Dir))
		if strings.Contains(err.Error(), "container already exists") {
			// Another create of the same ID won the race: its cgroups
			// are not ours to remove.
			return nil, nil, fmt.Errorf("%w: %w", err, errdefs.ErrConflict)
		}
		if cerr := g.removeCgroups(spec.ID); cerr != nil {
			err = errors.Join(err, cerr)
		}
		return nil, nil, err
	}
	return c, conf, nil
}

// spawn runs container.New like `runsc create` does: the spec read back
// from the bundle (validated and normalised by runsc's own code), the
// application's stdio on /dev/null and the console log.
func (g *Gvisor) spawn(conf *config.Config, id, bundle string, console *os.File) (*container.Container, error) {
	null, err := devNull()
	if err != nil {
		return nil, err
	}
	spawnMu.Lock()
	defer spawnMu.Unlock()
	// gVisor moves this whole process through the new sandbox's cgroups:
	// no child process of the server may start meanwhile.
	childproc.Lock()
	defer childproc.Unlock()
	// container.New gives the sandbox os.Stdin/os.Stdout/os.Stderr as the
	// application's stdio (sandbox.createSandboxProcess); the sandbox must
	// never hold the server's stdio (a pipe there would never see EOF).
	// There is no argument for it, so swap the variables while spawnMu is
	// held. Code elsewhere that reads os.Stdout at call time during these
	// few milliseconds writes to this sandbox's console log instead; the
	// server logs through a handler that captured os.Stderr at start-up.
	stdin, stdout, stderr := os.Stdin, os.Stdout, os.Stderr
	os.Stdin, os.Stdout, os.Stderr = null, console, console
	defer func() { os.Stdin, os.Stdout, os.Stderr = stdin, stdout, stderr }()

	for attempt := 1; ; attempt++ {
		// container.New modifies the spec it gets: read a fresh one each time.
		spec, err := specutils.ReadSpec(bundle, conf)
		if err != nil {
			return nil, fmt.Errorf("read spec: %w", err)
		}
		if err := specutils.FixConfig(conf, spec); err != nil {
			return nil, fmt.Errorf("apply spec annotations: %w", err)
		}
		c, err := container.New(conf, container.Args{ID: id, Spec: spec, BundleDir: bundle})
		if err == nil {
			g.adopt(id, c)
			return c, nil
		}
		// container.New destroys what it made on failure, except the
		// cgroups; a retry would find them and take them for the caller's
		// (then never removing them).
		if attempt < maxSpawnAttempts && strings.Contains(err.Error(), "cannot read client sync file") {
			if cerr := g.removeCgroups(id); cerr == nil {
				continue
			}
		}
		return nil, err
	}
}

// adopt records that this process is the parent of c's sandbox (and gofer)
// processes: it must reap them, or they would stay zombies that look alive
// to kill(pid, 0) and to runsc's status checks.
func (g *Gvisor) adopt(id string, c *container.Container) {
	ch := &child{pid: c.Sandbox.Pid.Load()}
	pids := []int{ch.pid}
	if gp := c.GoferPid.Load(); gp != 0 {
		pids = append(pids, gp)
	}
	for _, pid := range pids {
		done, err := pidfd.Watch(pid, true)
		if err != nil {
			// Cannot happen for our own child; if it does, State falls back
			// to runsc's checks and the process stays a zombie until we exit.
			continue
		}
		if pid == pids[0] {
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

// child is a sandbox whose process this process started.
type child struct {
	pid int
	// done is closed once the sandbox process has exited and been reaped.
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
