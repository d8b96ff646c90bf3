package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// crunTarget does the work with one crun CLI call per step: the cost of a
// plain Linux container, as the floor agentenv is compared against.
type crunTarget struct {
	*rawCommon
	ns *nsThread
}

func newCrunTarget(ctx context.Context, bin, dir string, rootfs rawRootfs, payload string) (*crunTarget, error) {
	if bin == "" {
		bin = "crun"
	}
	base := filepath.Join(dir, "crun")
	root := filepath.Join(base, "state")
	bundle := filepath.Join(base, "bundle")
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, err
	}
	t, err := newTool(bin, filepath.Join(base, "log"), "--root", root, "--cgroup-manager=disabled")
	if err != nil {
		return nil, err
	}
	spec := baseSpec(rootfs.dir)
	// Debian's crun 1.8 rejects spec versions newer than it knows
	// ("unknown version specified"); nothing here needs a newer one.
	spec.Version = "1.0.2"
	// Read-only root shared by every container, writes go to memory as in
	// gVisor's overlay.
	spec.Root.Readonly = true
	spec.Mounts = append(spec.Mounts, specs.Mount{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777"}})
	if err := writeBundle(bundle, spec); err != nil {
		t.close()
		return nil, err
	}
	ns, err := newNSThread()
	if err != nil {
		t.close()
		return nil, err
	}
	t.start = ns.start
	return &crunTarget{rawCommon: &rawCommon{tool: t, dir: base, prefix: "c", bundle: bundle, root: root, payload: payload, out: filepath.Join(base, "read")}, ns: ns}, nil
}

func (c *crunTarget) name() string { return TargetCrun }

func (c *crunTarget) close(ctx context.Context) error {
	err := c.rawCommon.close(ctx)
	c.ns.stop()
	return err
}

// nsThread starts commands from one OS thread that lives in a private mount
// namespace without /sys/fs/cgroup/unified. crun refuses to run on this
// host's mixed cgroup v1/v2 layout otherwise, and doing it once here keeps
// an `unshare` and a shell out of every measured crun call. The rest of the
// process keeps the host's mount namespace.
type nsThread struct {
	reqs chan func()
	done chan struct{}
}

func newNSThread() (*nsThread, error) {
	n := &nsThread{reqs: make(chan func()), done: make(chan struct{})}
	ready := make(chan error, 1)
	go func() {
		defer close(n.done)
		// Never unlocked: the thread's namespace differs from the
		// process's, so the runtime must throw the thread away when this
		// goroutine ends.
		runtime.LockOSThread()
		if err := enterPrivateMountNS(); err != nil {
			ready <- err
			return
		}
		ready <- nil
		for f := range n.reqs {
			f()
		}
	}()
	if err := <-ready; err != nil {
		return nil, err
	}
	return n, nil
}

func enterPrivateMountNS() error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("unshare mount namespace for crun: %w", err)
	}
	// Private first, so the unmount below does not reach the host.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private for crun: %w", err)
	}
	err := unix.Unmount("/sys/fs/cgroup/unified", unix.MNT_DETACH)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount /sys/fs/cgroup/unified for crun: %w", err)
	}
	return nil
}

// start starts cmd from the namespace thread: a forked child inherits the
// mount namespace of the thread that forks it.
func (n *nsThread) start(cmd *exec.Cmd) error {
	errc := make(chan error, 1)
	select {
	case n.reqs <- func() { errc <- cmd.Start() }:
	case <-n.done:
		return errors.New("crun namespace thread has stopped")
	}
	return <-errc
}

func (n *nsThread) stop() {
	close(n.reqs)
	<-n.done
}
