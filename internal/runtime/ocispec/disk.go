package ocispec

import (
	"path/filepath"
	"strconv"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// The write layer on disk (docs/design.md, "Write layer"): gVisor's rootfs
// overlay with a "self" filestore, i.e. the upper tmpfs keeps its pages in
// a sparse host file, <bundle>/rootfs/.gvisor.filestore.<id>, which gVisor
// creates at create (and restore) and deletes at destroy. The tmpfs size
// option bounds it: df shows it, writing past it gives ENOSPC.
//
// Two gVisor behaviours shape the spec:
//   - gVisor mounts a memory tmpfs over /tmp when /tmp is empty, which
//     would keep /tmp writes in RAM (and a large one kills the sandbox). A
//     mount point inside /tmp makes it non-empty: an empty read-only
//     mount at AnchorPath.
//   - Upstream runsc creates the filestore only inside a gofer's mount
//     namespace: without a gofer process (an EROFS-only sandbox) the
//     sandbox panics ("fdDispenser out of fds"). Our build's patch 0002
//     makes the sandbox create it (runscbin.Features.GoferlessFilestore);
//     the anchor is then an empty read-only tmpfs and no gofer runs. With
//     another runsc the anchor is a bind mount of an empty directory, and
//     runsc starts a gofer to serve it.

// AnchorPath is where the sandbox sees the read-only empty mount that
// keeps /tmp on the disk layer.
const AnchorPath = "/tmp/.agentenv"

// anchorDir is the anchor's source, inside the bundle.
const anchorDir = "anchor"

// FilestorePath is the host file that holds the write layer of the sandbox
// id whose runtime directory is dir (runtime.Spec.Dir). It is sparse: its
// size is the disk size, its blocks what the sandbox wrote.
func FilestorePath(dir, id string) string {
	return filepath.Join(dir, "bundle", "rootfs", ".gvisor.filestore."+id)
}

// DiskLayer gives spec s a write layer of diskMB on disk. anchor is an
// empty host directory to bind at AnchorPath, or "" for a runsc with
// Features.GoferlessFilestore (see above). Build calls it; the bench uses
// it to give raw runsc the same layer.
func DiskLayer(s *specs.Spec, diskMB int64, anchor string) {
	s.Annotations["dev.gvisor.spec.rootfs.overlay"] = "self"
	s.Annotations["dev.gvisor.spec.rootfs.options"] = "size=" + strconv.FormatInt(diskMB, 10) + "m"
	m := specs.Mount{Destination: AnchorPath, Type: "tmpfs", Source: "tmpfs",
		Options: []string{"ro", "nosuid", "nodev", "noexec", "size=4k", "mode=555"}}
	if anchor != "" {
		m = specs.Mount{Destination: AnchorPath, Type: "bind", Source: anchor,
			Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"}}
	}
	s.Mounts = append(s.Mounts, m)
}
