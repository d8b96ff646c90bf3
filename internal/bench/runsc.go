package bench

import (
	"context"
	"os"
	"path/filepath"

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
	spec.Annotations = map[string]string{
		"dev.gvisor.spec.rootfs.source":  rootfs.image,
		"dev.gvisor.spec.rootfs.type":    "erofs",
		"dev.gvisor.spec.rootfs.overlay": "memory",
	}
	if err := writeBundle(bundle, spec); err != nil {
		t.close()
		return nil, err
	}
	return &runscTarget{&rawCommon{tool: t, prefix: "r", bundle: bundle, root: root, payload: payload, out: filepath.Join(base, "read")}}, nil
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
