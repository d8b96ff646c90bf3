package bench

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Per-process and per-host counts the limits probe reads from /proc.

// procCounts are the countable resources of one host process.
type procCounts struct {
	pid     int
	threads int // entries of /proc/<pid>/task
	fds     int // entries of /proc/<pid>/fd
	maps    int // lines of /proc/<pid>/maps: mappings, bounded by vm.max_map_count
	nofile  int // soft RLIMIT_NOFILE; 0 when unlimited or unknown
}

// readProcCounts counts a process's threads, open files and memory maps.
// ok is false when the process has ended.
func readProcCounts(pid int) (c procCounts, ok bool, err error) {
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	c.pid = pid
	tasks, err := os.ReadDir(filepath.Join(dir, "task"))
	if err != nil {
		return c, false, ignoreGone(err)
	}
	c.threads = len(tasks)
	fds, err := os.ReadDir(filepath.Join(dir, "fd"))
	if err != nil {
		return c, false, ignoreGone(err)
	}
	c.fds = len(fds)
	maps, err := os.ReadFile(filepath.Join(dir, "maps"))
	if err != nil {
		return c, false, ignoreGone(err)
	}
	c.maps = bytes.Count(maps, []byte("\n"))
	if lim, err := os.ReadFile(filepath.Join(dir, "limits")); err == nil {
		c.nofile, _ = parseNofileSoft(lim)
	}
	return c, true, nil
}

// ignoreGone turns "the process has ended" into nil: a process can end
// between listing and reading.
func ignoreGone(err error) error {
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}

// countThreads sums the threads of pids (ended processes count 0).
func countThreads(pids []int) int {
	n := 0
	for _, pid := range pids {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err == nil {
			n += len(tasks)
		}
	}
	return n
}

// serverPID finds the process listening on the API address's port (the
// agentenv server): from /proc/net/tcp{,6} to the socket's inode, then to
// the process holding it. With several (a child that inherited it), the
// topmost one.
func serverPID(api string, procs map[int]proc) (int, error) {
	u, err := url.Parse(api)
	if err != nil {
		return 0, err
	}
	_, portStr, err := net.SplitHostPort(u.Host)
	if err != nil {
		return 0, fmt.Errorf("server URL %q names no port", api)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return 0, err
	}
	inodes := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, ino := range listeningInodes(b, port) {
			inodes[ino] = true
		}
	}
	if len(inodes) == 0 {
		return 0, fmt.Errorf("nothing on this host listens on port %d (is the server on another host?)", port)
	}
	holders := map[int]bool{}
	for pid := range procs {
		fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		if err != nil {
			continue
		}
		for _, fd := range fds {
			link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
			if err == nil && strings.HasPrefix(link, "socket:[") && inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] {
				holders[pid] = true
				break
			}
		}
	}
	for pid := range holders {
		if !holders[procs[pid].ppid] {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no process holds the socket listening on port %d", port)
}

// listeningInodes returns the socket inodes of /proc/net/tcp lines in
// LISTEN state (0A) on port.
func listeningInodes(b []byte, port int) []string {
	var out []string
	want := fmt.Sprintf(":%04X", port)
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 10 || f[3] != "0A" || !strings.HasSuffix(f[1], want) {
			continue
		}
		out = append(out, f[9])
	}
	return out
}

// helperPIDs returns the server's children that run the server's own
// binary (agentenv re-executed as a worker): short-lived children such as
// nft run another binary.
func helperPIDs(server int, procs map[int]proc) []int {
	exe, err := os.Stat(fmt.Sprintf("/proc/%d/exe", server))
	if err != nil {
		return nil
	}
	var out []int
	for pid, p := range procs {
		if p.ppid != server {
			continue
		}
		if st, err := os.Stat(fmt.Sprintf("/proc/%d/exe", pid)); err == nil && os.SameFile(exe, st) {
			out = append(out, pid)
		}
	}
	return out
}

// netNamespaces counts the distinct network namespaces on the host: those
// of processes and those kept by nsfs bind mounts (agentenv's network
// slots) in the given mountinfo files.
func netNamespaces(procs map[int]proc, mountinfos ...string) int {
	seen := map[string]bool{}
	for pid := range procs {
		if link, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid)); err == nil {
			seen[link] = true
		}
	}
	for _, mi := range mountinfos {
		b, err := os.ReadFile(mi)
		if err != nil {
			continue
		}
		for _, ns := range nsfsNetMounts(b) {
			seen[ns] = true
		}
	}
	return len(seen)
}

// nsfsNetMounts returns the namespaces ("net:[inode]") that nsfs mounts in
// a mountinfo file keep.
func nsfsNetMounts(b []byte) []string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		_, post, ok := strings.Cut(line, " - ")
		if !ok || !strings.HasPrefix(post, "nsfs ") {
			continue
		}
		f := strings.Fields(line)
		if len(f) > 3 && strings.HasPrefix(f[3], "net:[") {
			out = append(out, f[3])
		}
	}
	return out
}

// countLines counts the lines of a file.
func countLines(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return bytes.Count(b, []byte("\n")), nil
}
