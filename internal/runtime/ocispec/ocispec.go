// Package ocispec builds the OCI runtime spec (and bundle) of a sandbox
// for gVisor: EROFS root image with a write layer (a sized file on disk, or
// memory for sandboxes made before the disk layer), limits, namespaces.
// Both gVisor drivers use it, so a sandbox made by one can be listed,
// checkpointed and deleted by the other and by the runsc CLI. It must not
// start anything.
package ocispec

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/runtime"
	"github.com/agentenv/agentenv/internal/runtime/runscbin"
)

// Capabilities of the sandbox's init process (envd runs as root inside the
// sandbox and drops to the requested user per command). This is Docker's
// default set; gVisor's own kernel enforces them.
var defaultCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

// Build returns the OCI spec for spec, for a runsc with features f.
// cgroupsPath is empty when the runtime does not manage cgroups.
func Build(spec runtime.Spec, rootfs, cgroupsPath string, f runscbin.Features) *specs.Spec {
	caps := &specs.LinuxCapabilities{
		Bounding: defaultCaps, Effective: defaultCaps, Permitted: defaultCaps,
	}
	cwd := spec.Cwd
	if cwd == "" {
		cwd = "/"
	}
	nsList := []specs.LinuxNamespace{
		{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace},
		{Type: specs.UTSNamespace}, {Type: specs.MountNamespace},
		{Type: specs.NetworkNamespace, Path: spec.NetNS},
	}
	s := &specs.Spec{
		Version:  specs.Version,
		Hostname: spec.Hostname,
		Process: &specs.Process{
			User:         specs.User{UID: 0, GID: 0},
			Args:         spec.Args,
			Env:          spec.Env,
			Cwd:          cwd,
			Capabilities: caps,
			Rlimits:      rlimits(spec),
		},
		// The rootfs comes from the EROFS image (annotations below); the
		// path must still name an (empty) directory.
		Root: &specs.Root{Path: rootfs},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777"}},
		},
		Annotations: map[string]string{
			"dev.gvisor.spec.rootfs.source":  spec.Image,
			"dev.gvisor.spec.rootfs.type":    "erofs",
			"dev.gvisor.spec.rootfs.overlay": "memory",
		},
		Linux: &specs.Linux{
			Namespaces:  nsList,
			Resources:   resources(spec),
			CgroupsPath: cgroupsPath,
		},
	}
	if len(spec.Lowers) > 0 {
		s.Annotations[LowersAnnotation] = strings.Join(spec.Lowers, ":")
	}
	for _, b := range spec.Binds {
		s.Mounts = append(s.Mounts, specs.Mount{Destination: b.Destination, Type: "bind", Source: b.Source,
			Options: []string{"rbind", "rw", "nosuid", "nodev"}})
	}
	if spec.DiskMB > 0 {
		anchor := filepath.Join(filepath.Dir(rootfs), anchorDir)
		if f.GoferlessFilestore {
			anchor = ""
		}
		DiskLayer(s, spec.DiskMB, anchor)
	}
	return s
}

// LowersAnnotation names the EROFS images stacked below the rootfs image
// (runtime.Spec.Lowers), top first, ":"-separated as overlayfs's lowerdir.
// A runsc with patch 0008 (runscbin.Features.RootfsLowerImages) opens them
// in the sandbox process and gives the root overlay one lower layer each;
// a checkpoint names them by position, so a restore must give the same
// stack.
const LowersAnnotation = "dev.agentenv.rootfs.lowers"

// WriteBundle writes the OCI bundle for spec into spec.Dir and returns its
// path. The state file records the bundle path, and the sandbox process
// reads config.json from it, exactly as with `runsc create --bundle`. A
// spec with Lowers needs a runsc that stacks them (f.RootfsLowerImages).
func WriteBundle(spec runtime.Spec, cgroupsPath string, f runscbin.Features) (string, error) {
	if err := checkLowers(spec, f); err != nil {
		return "", err
	}
	bundle := filepath.Join(spec.Dir, "bundle")
	rootfs := filepath.Join(bundle, "rootfs")
	if err := os.MkdirAll(rootfs, 0o755); err != nil {
		return "", err
	}
	if spec.DiskMB > 0 && !f.GoferlessFilestore {
		if err := os.MkdirAll(filepath.Join(bundle, anchorDir), 0o555); err != nil {
			return "", err
		}
	}
	b, err := json.MarshalIndent(Build(spec, rootfs, cgroupsPath, f), "", "  ")
	if err != nil {
		return "", err
	}
	return bundle, os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o600)
}

// checkLowers refuses a stack this runsc cannot mount or the annotation
// cannot carry.
func checkLowers(spec runtime.Spec, f runscbin.Features) error {
	if len(spec.Lowers) == 0 {
		return nil
	}
	if !f.RootfsLowerImages {
		return errdefs.Invalid("sandbox %s: its template is a stack of %d layers, and this runsc cannot stack them: install agentenv's runsc build (make setup)", spec.ID, len(spec.Lowers)+1)
	}
	for _, p := range spec.Lowers {
		if !filepath.IsAbs(p) || strings.Contains(p, ":") {
			return errdefs.Invalid("sandbox %s: layer image %q: want an absolute path without ':'", spec.ID, p)
		}
	}
	return nil
}

func resources(spec runtime.Spec) *specs.LinuxResources {
	r := &specs.LinuxResources{}
	if spec.MemoryMB > 0 {
		limit := spec.MemoryMB << 20
		r.Memory = &specs.LinuxMemory{Limit: &limit}
	}
	if spec.CPUs > 0 {
		period := uint64(100000)
		quota := int64(spec.CPUs * float64(period))
		r.CPU = &specs.LinuxCPU{Period: &period, Quota: &quota}
	}
	if spec.Pids > 0 {
		// gVisor enforces RLIMIT_NPROC itself (forks fail with EAGAIN); the
		// host pids cgroup is only a backstop, since hitting it crashes the
		// whole sandbox (each sandbox task costs 1-2 host threads).
		r.Pids = &specs.LinuxPids{Limit: 3*spec.Pids + 128}
	}
	return r
}

func rlimits(spec runtime.Spec) []specs.POSIXRlimit {
	out := []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 1 << 20, Soft: 1 << 20}}
	if spec.Pids > 0 {
		out = append(out, specs.POSIXRlimit{Type: "RLIMIT_NPROC", Hard: uint64(spec.Pids), Soft: uint64(spec.Pids)})
	}
	return out
}
