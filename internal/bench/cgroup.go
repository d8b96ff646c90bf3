package bench

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The CPU a target costs is counted in a cgroup v2 directory of its own:
// the bench starts every process of the target in it (the server it
// starts, each runsc and crun CLI call), and everything those start (gVisor
// workers, sandbox, gofer and stub processes, nft, container inits) is born
// there too. cpu.stat's usage_usec then sums them all, also the processes
// that have already ended. It needs no controller: the cgroup core counts
// CPU on the v2 hierarchy even where the cpu controller is bound to v1, as
// on this project's hosts (v1 controllers, v2 mounted at
// /sys/fs/cgroup/unified). gVisor moves sandboxes between v1 cgroups only,
// so they stay in ours.

// cgroup2Roots are where a cgroup v2 hierarchy may be mounted: alone, or
// beside the v1 controllers.
var cgroup2Roots = []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"}

// cpuGroup is one target's cgroup.
type cpuGroup struct {
	dir string
	fd  *os.File // the directory, for CLONE_INTO_CGROUP
	// extra are other cgroups whose CPU belongs to the target: on a host
	// with cgroup v2 alone, the server moves each sandbox into
	// <root>/agentenv/<id>, outside dir.
	extra []string
}

// cpuGroups are the cgroups of one run: a parent named after the run, one
// child per target.
type cpuGroups struct {
	root   string
	parent string
	byName map[string]*cpuGroup
}

// findCgroup2 returns the mount point of the cgroup v2 hierarchy and
// whether it is the only one (no v1 controllers beside it).
func findCgroup2() (root string, only bool, err error) {
	for i, r := range cgroup2Roots {
		var st unix.Statfs_t
		if unix.Statfs(r, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
			return r, i == 0, nil
		}
	}
	return "", false, fmt.Errorf("no cgroup v2 hierarchy at %s: CPU per operation is counted in cgroup v2 (cpu.stat)", strings.Join(cgroup2Roots, " or "))
}

// newCPUGroups makes <root>/agentenv-bench-<run>/<name> for every name.
func newCPUGroups(run string, names ...string) (_ *cpuGroups, err error) {
	root, only, err := findCgroup2()
	if err != nil {
		return nil, err
	}
	gs := &cpuGroups{root: root, parent: filepath.Join(root, "agentenv-bench-"+run), byName: map[string]*cpuGroup{}}
	if err := os.Mkdir(gs.parent, 0o755); err != nil {
		return nil, fmt.Errorf("make a cgroup for the bench: %w", err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, gs.remove(context.Background()))
		}
	}()
	for _, n := range names {
		dir := filepath.Join(gs.parent, n)
		if err := os.Mkdir(dir, 0o755); err != nil {
			return nil, fmt.Errorf("make a cgroup for %s: %w", n, err)
		}
		fd, err := os.Open(dir)
		if err != nil {
			return nil, err
		}
		g := &cpuGroup{dir: dir, fd: fd}
		if only && n == TargetAgentenv {
			// The server's default cgroup parent (gvisorgo.Config).
			g.extra = []string{filepath.Join(root, "agentenv")}
		}
		gs.byName[n] = g
	}
	return gs, nil
}

// get returns the named group, or nil when gs is nil or has none.
func (gs *cpuGroups) get(name string) *cpuGroup {
	if gs == nil {
		return nil
	}
	return gs.byName[name]
}

// remove removes the cgroups once they are empty. Whatever is still in
// one a few seconds after its target was closed was started by this run
// (every process there descends from one the bench started), so it is
// killed with cgroup.kill first.
func (gs *cpuGroups) remove(ctx context.Context) error {
	var errs []error
	for _, g := range gs.byName {
		g.fd.Close()
		errs = append(errs, removeCgroup(ctx, g.dir))
	}
	return errors.Join(append(errs, removeCgroup(ctx, gs.parent))...)
}

func removeCgroup(ctx context.Context, dir string) error {
	deadline := time.Now().Add(5 * time.Second)
	killed := false
	for {
		err := unix.Rmdir(dir)
		switch {
		case err == nil, errors.Is(err, unix.ENOENT):
			return nil
		case !errors.Is(err, unix.EBUSY):
			return fmt.Errorf("remove cgroup %s: %w", dir, err)
		case time.Now().After(deadline) && killed:
			return fmt.Errorf("remove cgroup %s: processes left in it: %w", dir, err)
		case time.Now().After(deadline):
			os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0)
			killed, deadline = true, time.Now().Add(5*time.Second)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("remove cgroup %s: %w", dir, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// attach makes a command started with attr begin its life in g.
func (g *cpuGroup) attach(attr *syscall.SysProcAttr) {
	if g == nil {
		return
	}
	attr.UseCgroupFD = true
	attr.CgroupFD = int(g.fd.Fd())
}

// usage is the CPU time every process ever in g (and its extra cgroups)
// has used.
func (g *cpuGroup) usage() (time.Duration, error) {
	var sum time.Duration
	for i, dir := range append([]string{g.dir}, g.extra...) {
		b, err := os.ReadFile(filepath.Join(dir, "cpu.stat"))
		if i > 0 && errors.Is(err, os.ErrNotExist) {
			continue // made by the first sandbox: it used nothing before
		}
		if err != nil {
			return 0, err
		}
		u, err := parseUsageUsec(b)
		if err != nil {
			return 0, fmt.Errorf("%s/cpu.stat: %w", dir, err)
		}
		sum += u
	}
	return sum, nil
}

// parseUsageUsec reads usage_usec from a cgroup v2 cpu.stat.
func parseUsageUsec(b []byte) (time.Duration, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if !ok || k != "usage_usec" {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("usage_usec %q: %w", v, err)
		}
		return time.Duration(n) * time.Microsecond, nil
	}
	return 0, errors.New("no usage_usec")
}

// setUpCgroups makes the cgroups of the targets whose CPU the run can
// count, if a group that counts CPU runs, and pushes their removal onto
// cl (first, so that it runs after the targets and the server are gone).
// Without them the run goes on and says why in a note.
func setUpCgroups(cfg Config, cl *cleanupStack) (*cpuGroups, []string) {
	if !cfg.runs(GroupCPU) && !cfg.runs(GroupRollout) && !cfg.runs(GroupRL) {
		return nil, nil
	}
	var names []string
	if cfg.Serve.Binary != "" {
		names = append(names, TargetAgentenv)
	}
	if !cfg.SkipRaw {
		names = append(names, TargetRunsc, TargetCrun)
	}
	switch {
	case len(names) == 0:
		return nil, []string{"cpu: not counted: the bench counts the CPU of a server it starts (--serve) and of the raw runtimes"}
	case os.Geteuid() != 0:
		return nil, []string{"cpu: not counted: making cgroups needs root"}
	}
	b := make([]byte, 4)
	rand.Read(b)
	gs, err := newCPUGroups(hex.EncodeToString(b), names...)
	if err != nil {
		return nil, []string{fmt.Sprintf("cpu: not counted: %v", err)}
	}
	cl.push(gs.remove)
	return gs, nil
}
