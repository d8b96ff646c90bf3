package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// rawRootfs is the busybox root filesystem the raw runtimes run, as a
// directory (crun) and as an EROFS image of the same tree (runsc, as
// agentenv's templates are).
type rawRootfs struct {
	dir   string
	image string
}

// applets are the busybox commands the raw containers need.
var applets = []string{"sh", "cat", "true", "sleep", "dd"}

func makeRootfs(ctx context.Context, dir, busybox string) (rawRootfs, error) {
	if busybox == "" {
		busybox = "/bin/busybox"
	}
	r := rawRootfs{dir: filepath.Join(dir, "rootfs"), image: filepath.Join(dir, "rootfs.erofs")}
	// Mount points must exist in the directory: crun mounts onto a
	// read-only root and cannot create them.
	for _, d := range []string{"bin", "proc", "dev", "sys", "tmp", "etc"} {
		if err := os.MkdirAll(filepath.Join(r.dir, d), 0o755); err != nil {
			return r, err
		}
	}
	if err := copyExecutable(busybox, filepath.Join(r.dir, "bin/busybox")); err != nil {
		return r, fmt.Errorf("busybox for the raw rootfs (package busybox-static): %w", err)
	}
	for _, a := range applets {
		if err := os.Symlink("busybox", filepath.Join(r.dir, "bin", a)); err != nil {
			return r, err
		}
	}
	// gVisor's EROFS reader maps only plain file data; tail-packed files
	// fail to load with "bad address".
	out, err := exec.CommandContext(ctx, "mkfs.erofs", "-E", "noinline_data", r.image, r.dir).CombinedOutput()
	if err != nil {
		return r, fmt.Errorf("mkfs.erofs (package erofs-utils): %w: %s", err, out)
	}
	return r, nil
}

func copyExecutable(from, to string) error {
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return err
	}
	return dst.Close()
}

// caps is Docker's default capability set, as agentenv's sandboxes get.
var caps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

// baseSpec is the OCI spec both raw runtimes start from: busybox sleeping
// as init, so that commands can be exec'd into the container.
func baseSpec(root string) specs.Spec {
	c := &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps}
	return specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			Args:         []string{"/bin/sleep", "100000"},
			Env:          []string{"PATH=/bin"},
			Cwd:          "/",
			Capabilities: c,
			Rlimits:      []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 1024, Soft: 1024}},
		},
		Root:     &specs.Root{Path: root},
		Hostname: "bench",
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		},
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace},
				{Type: specs.MountNamespace}, {Type: specs.NetworkNamespace},
			},
		},
	}
}

// writeBundle writes spec as dir/config.json.
func writeBundle(dir string, spec specs.Spec) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(&spec, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600)
}
