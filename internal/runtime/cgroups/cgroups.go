// Package cgroups removes a sandbox's cgroup directories, under every
// controller (cgroup v1) or in the unified tree (v2). gVisor creates them
// before it starts the sandbox but removes them only if the sandbox process
// was started, so a create that fails early (a missing image, say) leaves
// them behind, through `runsc` and through gVisor's Go packages alike: both
// runtimes call Remove when they destroy a sandbox. It knows cgroup paths,
// not sandboxes; only directories named by the caller's parent and ID are
// touched.
package cgroups

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

const root = "/sys/fs/cgroup"

// Remove kills what is left in the cgroups of sandbox id under parent and
// removes them. A host without cgroups mounted has nothing to remove.
func Remove(parent, id string) error {
	if parent == "" || id == "" || strings.ContainsAny(parent+id, "\x00") || strings.Contains(id, "/") || strings.Contains(id, "..") {
		return fmt.Errorf("cgroups: bad parent %q or sandbox ID %q", parent, id)
	}
	rel := filepath.Join("/", parent, id)
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		return nil
	}
	dirs := []string{filepath.Join(root, rel)} // cgroup v2 only
	if st.Type != unix.CGROUP2_SUPER_MAGIC {
		ctrls, err := os.ReadDir(root)
		if err != nil {
			return err
		}
		dirs = dirs[:0]
		for _, c := range ctrls {
			dirs = append(dirs, filepath.Join(root, c.Name(), rel))
		}
	}
	var errs []error
	for _, d := range dirs {
		killTasks(d)
	}
	for _, d := range dirs {
		if err := rmdirCgroup(d); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Left lists the cgroup directories of sandbox id under parent that exist
// (for tests that check a sandbox left nothing).
func Left(parent, id string) []string {
	m, _ := filepath.Glob(filepath.Join(root, "*", parent, id))
	if d := filepath.Join(root, parent, id); isDir(d) {
		m = append(m, d)
	}
	return m
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// rmdirCgroup removes one cgroup directory, retrying for a moment while the
// kernel still counts exiting tasks in it (EBUSY).
func rmdirCgroup(dir string) error {
	for i := 0; ; i++ {
		err := unix.Rmdir(dir)
		switch {
		case err == nil, errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOTDIR):
			return nil
		case errors.Is(err, unix.EBUSY) && i < 50:
			time.Sleep(20 * time.Millisecond)
		default:
			return fmt.Errorf("remove cgroup %s: %w", dir, err)
		}
	}
}

// killTasks kills what is left in a sandbox's cgroup whose container state
// is gone: the processes of a create that a crash cut short. The calling
// process is never killed (a worker passes through the sandbox's cgroups
// while it creates the sandbox).
func killTasks(dir string) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return
	}
	self := os.Getpid()
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err == nil && pid > 1 && pid != self {
			unix.Kill(pid, unix.SIGKILL)
		}
	}
}
