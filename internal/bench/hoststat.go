package bench

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Host-wide counters from /proc, read by the churn levels (CPU), the
// density group (memory) and the limits probe (the rest). Each parser takes
// the file's contents, so that tests need no particular host.

// cpuTimes are the host's CPU times summed over all cores, in clock ticks.
type cpuTimes struct{ busy, total uint64 }

func readCPUTimes() (cpuTimes, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuTimes{}, err
	}
	return parseCPUTimes(b)
}

// parseCPUTimes reads the "cpu" line of /proc/stat: user nice system idle
// iowait irq softirq steal (guest time is already in user). Idle and
// iowait are not busy.
func parseCPUTimes(b []byte) (cpuTimes, error) {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 5 || f[0] != "cpu" {
		return cpuTimes{}, errors.New("/proc/stat: no cpu line first")
	}
	var t cpuTimes
	for i, s := range f[1:min(len(f), 9)] {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return cpuTimes{}, fmt.Errorf("/proc/stat: cpu field %d: %w", i+1, err)
		}
		t.total += v
		if i != 3 && i != 4 { // idle, iowait
			t.busy += v
		}
	}
	return t, nil
}

// busySince is the share of CPU time between before and t that was busy.
func (t cpuTimes) busySince(before cpuTimes) float64 {
	if t.total <= before.total {
		return 0
	}
	return float64(t.busy-before.busy) / float64(t.total-before.total)
}

// readMeminfoKiB returns one field of /proc/meminfo (e.g. MemAvailable) in
// KiB.
func readMeminfoKiB(field string) (uint64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	return parseMeminfoKiB(b, field)
}

func parseMeminfoKiB(b []byte, field string) (uint64, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == field+":" {
			return strconv.ParseUint(f[1], 10, 64)
		}
	}
	return 0, fmt.Errorf("/proc/meminfo has no %s", field)
}

// parseLoadavgTasks returns the number of threads on the host: the part
// after the slash of /proc/loadavg's fourth field ("running/total").
func parseLoadavgTasks(b []byte) (int, error) {
	f := strings.Fields(string(b))
	if len(f) < 4 {
		return 0, errors.New("/proc/loadavg: too few fields")
	}
	_, total, ok := strings.Cut(f[3], "/")
	if !ok {
		return 0, fmt.Errorf("/proc/loadavg: %q is not running/total", f[3])
	}
	return strconv.Atoi(total)
}

// firstInt parses the first whitespace-separated field of b (a sysctl such
// as kernel.pid_max, or fs/file-nr whose first field is the handles in
// use).
func firstInt(b []byte) (int, error) {
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, errors.New("empty")
	}
	return strconv.Atoi(f[0])
}

func readFirstInt(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	n, err := firstInt(b)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return n, nil
}

// parseCgroupCount returns num_cgroups of one controller from
// /proc/cgroups.
func parseCgroupCount(b []byte, controller string) (int, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 3 && f[0] == controller {
			return strconv.Atoi(f[2])
		}
	}
	return 0, fmt.Errorf("/proc/cgroups has no %s controller", controller)
}

// parseNofileSoft returns the soft "Max open files" of /proc/<pid>/limits.
func parseNofileSoft(b []byte) (int, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "Max open files"); ok {
			f := strings.Fields(rest)
			if len(f) == 0 {
				break
			}
			if f[0] == "unlimited" {
				return 0, nil
			}
			return strconv.Atoi(f[0])
		}
	}
	return 0, errors.New("no Max open files line")
}

// neighStats are the host's neighbour (ARP) table counters from
// /proc/net/stat/arp_cache. The table is one for all network namespaces:
// its size is bounded by net.ipv4.neigh.default.gc_thresh3 host-wide.
type neighStats struct {
	entries    int // now, in all namespaces
	tableFulls int // times an entry could not be made: the table was full
	forcedGCs  int // garbage collections forced by a table at its bound
}

// parseArpCache reads /proc/net/stat/arp_cache: a header, then one line of
// hex counters per CPU; entries is table-wide (the same on every line),
// the event counters are per CPU and summed.
func parseArpCache(b []byte) (neighStats, error) {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) < 2 {
		return neighStats{}, errors.New("arp_cache: no counters")
	}
	col := map[string]int{}
	for i, h := range strings.Fields(lines[0]) {
		col[h] = i
	}
	need := []string{"entries", "forced_gc_runs", "table_fulls"}
	for _, h := range need {
		if _, ok := col[h]; !ok {
			return neighStats{}, fmt.Errorf("arp_cache: no %s column", h)
		}
	}
	var s neighStats
	for i, line := range lines[1:] {
		f := strings.Fields(line)
		get := func(h string) (int, error) {
			if col[h] >= len(f) {
				return 0, fmt.Errorf("arp_cache line %d: too few fields", i+2)
			}
			v, err := strconv.ParseUint(f[col[h]], 16, 64)
			return int(v), err
		}
		e, err1 := get("entries")
		g, err2 := get("forced_gc_runs")
		t, err3 := get("table_fulls")
		if err := errors.Join(err1, err2, err3); err != nil {
			return neighStats{}, err
		}
		s.entries = e
		s.forcedGCs += g
		s.tableFulls += t
	}
	return s, nil
}
