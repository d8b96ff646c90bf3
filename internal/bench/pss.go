package bench

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// proc is one host process as /proc shows it.
type proc struct {
	ppid int
	args []string
}

// readProcs reads the parent and command line of every process on the
// host. Processes that end while it reads are left out.
func readProcs() (map[int]proc, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	out := map[int]proc{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		ppid, err := parsePPID(stat)
		if err != nil {
			return nil, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		out[pid] = proc{ppid: ppid, args: strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")}
	}
	return out, nil
}

// parsePPID returns the parent PID from the contents of /proc/<pid>/stat.
// The command name in parentheses may itself hold spaces and parentheses,
// so the fields are counted from the last ')'.
func parsePPID(stat []byte) (int, error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("no ')' after the command name")
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 2 {
		return 0, errors.New("too few fields")
	}
	return strconv.Atoi(f[1]) // f[0] is the state
}

// runscProcsOf returns the runsc processes (runsc-sandbox, runsc-gofer)
// whose command line names id. The runsc CLI itself (argv[0] "runsc") is
// left out: a `runsc state ID` in flight is not part of the sandbox.
func runscProcsOf(procs map[int]proc, id string) []int {
	var out []int
	for pid, p := range procs {
		if len(p.args) == 0 || !strings.HasPrefix(filepath.Base(p.args[0]), "runsc-") {
			continue
		}
		if slices.ContainsFunc(p.args[1:], func(a string) bool { return strings.Contains(a, id) }) {
			out = append(out, pid)
		}
	}
	slices.Sort(out)
	return out
}

// descendants returns roots and every process below them, sorted.
func descendants(procs map[int]proc, roots []int) []int {
	children := map[int][]int{}
	for pid, p := range procs {
		children[p.ppid] = append(children[p.ppid], pid)
	}
	seen := map[int]bool{}
	queue := slices.Clone(roots)
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		if seen[pid] {
			continue
		}
		seen[pid] = true
		queue = append(queue, children[pid]...)
	}
	out := make([]int, 0, len(seen))
	for pid := range seen {
		out = append(out, pid)
	}
	slices.Sort(out)
	return out
}

// distinctAddressSpaces keeps one process per address space. gVisor's
// systrap stub processes are clones that share one address space (CLONE_VM
// without CLONE_THREAD): /proc shows each with the same smaps, so summing
// them would count the same pages several times.
func distinctAddressSpaces(pids []int, same func(a, b int) (bool, error)) ([]int, error) {
	var reps []int
	for _, pid := range pids {
		dup := false
		for _, r := range reps {
			ok, err := same(r, pid)
			if err != nil {
				return nil, err
			}
			if ok {
				dup = true
				break
			}
		}
		if !dup {
			reps = append(reps, pid)
		}
	}
	return reps, nil
}

// sameAddressSpace reports whether two processes share their memory map,
// with kcmp(2) (needs the right to ptrace both: root).
func sameAddressSpace(a, b int) (bool, error) {
	const kcmpVM = 1
	r, _, errno := unix.Syscall6(unix.SYS_KCMP, uintptr(a), uintptr(b), kcmpVM, 0, 0, 0)
	if errno == unix.ESRCH {
		return false, nil // one has ended: it will count as nothing
	}
	if errno != 0 {
		return false, fmt.Errorf("kcmp(%d, %d, KCMP_VM): %w", a, b, errno)
	}
	return r == 0, nil
}

// pss is the proportional set size of some processes, in KiB, with its
// parts: anonymous memory, file pages (binaries, shared with every process
// that maps them) and shared memory (gVisor's memory file).
type pss struct {
	Total, Anon, File, Shmem uint64
}

func (p pss) plus(q pss) pss {
	return pss{p.Total + q.Total, p.Anon + q.Anon, p.File + q.File, p.Shmem + q.Shmem}
}

// parseSmapsRollup reads the Pss lines of /proc/<pid>/smaps_rollup.
func parseSmapsRollup(b []byte) (pss, error) {
	var p pss
	found := false
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 3 || f[2] != "kB" {
			continue
		}
		var dst *uint64
		switch f[0] {
		case "Pss:":
			dst, found = &p.Total, true
		case "Pss_Anon:":
			dst = &p.Anon
		case "Pss_File:":
			dst = &p.File
		case "Pss_Shmem:":
			dst = &p.Shmem
		default:
			continue
		}
		v, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			return pss{}, fmt.Errorf("%s %q: %w", f[0], f[1], err)
		}
		*dst = v
	}
	if !found {
		return pss{}, errors.New("no Pss line")
	}
	return p, nil
}

// processesPSS sums the PSS of pids, counting each address space once.
// A process that ended meanwhile counts as nothing.
func processesPSS(pids []int) (pss, error) {
	reps, err := distinctAddressSpaces(pids, sameAddressSpace)
	if err != nil {
		return pss{}, err
	}
	var sum pss
	for _, pid := range reps {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ESRCH) {
			continue
		}
		if err != nil {
			return pss{}, err
		}
		p, err := parseSmapsRollup(b)
		if err != nil {
			return pss{}, fmt.Errorf("/proc/%d/smaps_rollup: %w", pid, err)
		}
		sum = sum.plus(p)
	}
	return sum, nil
}
