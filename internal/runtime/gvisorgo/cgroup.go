package gvisorgo

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

const cgroupRoot = "/sys/fs/cgroup"

// removeCgroups removes the (empty) cgroup directories of sandbox id under
// every controller. gVisor creates them before it starts the sandbox but
// removes them only if the sandbox process was started, so a create that
// fails early (a missing image, say) leaves them behind; `runsc create`
// does the same. Only directories named by our own cgroup path are touched.
func (s settings) removeCgroups(id string) error {
	rel := s.cgroupPath(id)
	if rel == "" {
		return nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs(cgroupRoot, &st); err != nil {
		return nil // no cgroups mounted: nothing to remove
	}
	dirs := []string{filepath.Join(cgroupRoot, rel)} // cgroup v2 only
	if st.Type != unix.CGROUP2_SUPER_MAGIC {
		ctrls, err := os.ReadDir(cgroupRoot)
		if err != nil {
			return err
		}
		dirs = dirs[:0]
		for _, c := range ctrls {
			dirs = append(dirs, filepath.Join(cgroupRoot, c.Name(), rel))
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

// RemoveCgroups kills what is left in sandbox id's cgroups under parent
// (the runtime's CgroupParent) and removes them: for cleaning up after a
// host whose agent is gone for good (a test's nodes), where no Destroy
// will ever run.
func RemoveCgroups(parent, id string) error {
	if err := validID(id); err != nil {
		return err
	}
	return settings{Cgroups: true, Parent: parent}.removeCgroups(id)
}
