package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// runscTarget does the work with one runsc CLI call per step, the way a
// caller without agentenv would.
type runscTarget struct {
	*rawCommon
}

func newRunscTarget(ctx context.Context, bin, dir string, rootfs rawRootfs, payload string) (*runscTarget, error) {
	if bin == "" {
		bin = "runsc"
	}
	base := filepath.Join(dir, "runsc")
	root := filepath.Join(base, "state")
	bundle := filepath.Join(base, "bundle")
	// With an EROFS root, root.path is not used, but must name a directory.
	if err := os.MkdirAll(filepath.Join(bundle, "empty"), 0o755); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, err
	}
	t, err := newTool(bin, filepath.Join(base, "log"),
		"--root", root, "--platform=systrap", "--network=none", "--ignore-cgroups")
	if err != nil {
		return nil, err
	}
	spec := baseSpec(filepath.Join(bundle, "empty"))
	// As in agentenv's spec; the dirty-snapshot rows write there.
	spec.Mounts = append(spec.Mounts, specs.Mount{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777"}})
	spec.Annotations = map[string]string{
		"dev.gvisor.spec.rootfs.source":  rootfs.image,
		"dev.gvisor.spec.rootfs.type":    "erofs",
		"dev.gvisor.spec.rootfs.overlay": "memory",
	}
	if err := writeBundle(bundle, spec); err != nil {
		t.close()
		return nil, err
	}
	return &runscTarget{&rawCommon{tool: t, dir: base, prefix: "r", bundle: bundle, root: root, payload: payload, out: filepath.Join(base, "read")}}, nil
}

func (r *runscTarget) name() string { return TargetRunsc }

func (r *runscTarget) close(ctx context.Context) error {
	err := r.rawCommon.close(ctx)
	// runsc pins the gofers' empty netns with a bind mount under its root
	// and never unmounts it; the temp dir cannot go while it is there.
	nullNetNS := filepath.Join(r.root, "null-netns")
	for unix.Unmount(nullNetNS, unix.MNT_DETACH) == nil {
	}
	return err
}

func (r *runscTarget) pause(ctx context.Context, id string) error {
	return r.tool.run(ctx, nil, nil, "pause", id)
}

func (r *runscTarget) resume(ctx context.Context, id string) error {
	return r.tool.run(ctx, nil, nil, "resume", id)
}

// snapshot checkpoints the container into a new directory, leaving it
// running, and returns the directory.
func (r *runscTarget) snapshot(ctx context.Context, id string) (string, error) {
	dir, err := os.MkdirTemp(r.dir, "ckpt-")
	if err != nil {
		return "", err
	}
	if err := r.tool.run(ctx, nil, nil, "checkpoint", "--leave-running", "--image-path", dir, id); err != nil {
		return "", errors.Join(err, os.RemoveAll(dir))
	}
	return dir, nil
}

func (r *runscTarget) dropSnapshot(_ context.Context, dir string) error { return os.RemoveAll(dir) }

// restore starts a new container from a checkpoint directory and runs
// /bin/true in it. The bundle is the one the checkpointed container ran:
// runsc refuses a restore whose process args differ.
func (r *runscTarget) restore(ctx context.Context, dir string) (string, error) {
	id := r.newID()
	if err := r.tool.run(ctx, nil, nil, "restore", "--detach", "--bundle", r.bundle, "--image-path", dir, id); err != nil {
		return "", errors.Join(err, r.kill(context.WithoutCancel(ctx), id))
	}
	if err := r.exec(ctx, id); err != nil {
		return "", errors.Join(fmt.Errorf("first command: %w", err), r.kill(context.WithoutCancel(ctx), id))
	}
	return id, nil
}

// fork is what a caller of the runsc CLI would do: checkpoint, then n
// restores of it at once, each followed by /bin/true; the checkpoint is
// removed at the end, as agentenv removes a fork's internal snapshot.
func (r *runscTarget) fork(ctx context.Context, id string, n int) ([]string, error) {
	dir, err := r.snapshot(ctx, id)
	if err != nil {
		return nil, err
	}
	var (
		mu   sync.Mutex
		kids []string
		wg   sync.WaitGroup
		errs = make([]error, n)
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			kid, err := r.restore(ctx, dir)
			if err != nil {
				errs[i] = err
				return
			}
			mu.Lock()
			kids = append(kids, kid)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return kids, errors.Join(append(errs, os.RemoveAll(dir))...)
}
