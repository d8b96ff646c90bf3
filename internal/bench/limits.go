package bench

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"time"
)

// The limits probe: with the density group's agentenv sandboxes up, count
// what grows with the number of sandboxes (threads, open files, memory
// maps, nftables rules, network interfaces and namespaces, cgroups, mounts,
// memory), once before the first sandbox starts and once with all of them
// up, and extrapolate each linearly to ten times as many sandboxes against
// the host's limit for it. Measured on this host, so it says which limit
// comes first here, not on every host.

// Limits is the outcome of the limits probe.
type Limits struct {
	// Sandboxes were up in the second sample (none in the first).
	Sandboxes int        `json:"sandboxes"`
	Rows      []LimitRow `json:"rows"`
	// First is the key of the row whose limit is reached with the fewest
	// sandboxes, and FirstReachedAt that number.
	First          string  `json:"first,omitempty"`
	FirstReachedAt float64 `json:"first_reached_at,omitempty"`
}

// LimitRow is one counted resource.
type LimitRow struct {
	Key   string `json:"key"`
	Label string `json:"label"`
	// PerProcess rows hold a value of one sandbox or one process (the
	// largest seen) that does not add up with more sandboxes: at ten
	// times as many it stays the same. Other rows are host- or
	// server-wide totals, extrapolated linearly.
	PerProcess bool    `json:"per_process,omitempty"`
	Before     float64 `json:"before"`
	After      float64 `json:"after"`
	// PerSandbox is (After - Before) / Sandboxes.
	PerSandbox float64 `json:"per_sandbox"`
	// At10x is Before + 10 × (After - Before): the value with ten times
	// as many sandboxes.
	At10x float64 `json:"at_10x"`
	// Limit is the host's bound for the value (0: none), LimitName says
	// which.
	Limit     float64 `json:"limit,omitempty"`
	LimitName string  `json:"limit_name,omitempty"`
	// ReachedAt is the number of sandboxes at which the value reaches
	// Limit, linearly (0: never, or no limit).
	ReachedAt float64 `json:"reached_at,omitempty"`
}

// Limits the host does not expose as a file.
const (
	// goMaxThreads is the Go runtime's default debug.SetMaxThreads: a Go
	// process (the server, its helpers, runsc) with more threads crashes.
	goMaxThreads = 10000
	// memcgIDMax is the most memory cgroups cgroup v1 can have (memcg IDs
	// are 16 bits, MEM_CGROUP_ID_MAX), dying ones included.
	memcgIDMax = 65535
)

// hostLimits are the host's bounds, read from /proc/sys.
type hostLimits struct {
	pidMax, threadsMax, fileMax, maxMapCount, mountMax, maxNetNS int
	neighMax                                                     int // net.ipv4.neigh.default.gc_thresh3
}

func readHostLimits() hostLimits {
	get := func(p string) int { n, _ := readFirstInt(p); return n }
	return hostLimits{
		pidMax:      get("/proc/sys/kernel/pid_max"),
		threadsMax:  get("/proc/sys/kernel/threads-max"),
		fileMax:     get("/proc/sys/fs/file-max"),
		maxMapCount: get("/proc/sys/vm/max_map_count"),
		mountMax:    get("/proc/sys/fs/mount-max"),
		maxNetNS:    get("/proc/sys/user/max_net_namespaces"),
		neighMax:    get("/proc/sys/net/ipv4/neigh/default/gc_thresh3"),
	}
}

// hostSample is what the probe counts at one moment. A count that could
// not be read is -1.
type hostSample struct {
	tasks, files, ifaces, netns, memcgs int

	neigh    neighStats
	neighErr error

	nftLines, nftChains int
	nftList             time.Duration
	nftErr              error

	server       procCounts // pid 0: not found
	serverMounts int
	serverErr    error
	// helper is, per count, the largest over the server's helper
	// processes (gVisor workers); helpers is how many there are.
	helper  procCounts
	helpers int

	// Of the sandboxes' host processes (only when sandboxes are up).
	sandboxes       int
	threadsMean     float64 // host threads per sandbox, all its processes
	threadsMax      int
	procMax         procCounts // per count, the largest of any one process
	procMaxFdsLimit int        // RLIMIT_NOFILE of the process with the most fds
}

// sampleHost counts everything once. pidsOf returns the host processes of
// each running sandbox (none for the sample before they start).
func sampleHost(ctx context.Context, api string, pidsOf func(map[int]proc) ([][]int, error)) (hostSample, error) {
	s := hostSample{tasks: -1, files: -1, ifaces: -1, netns: -1, memcgs: -1}
	procs, err := readProcs()
	if err != nil {
		return s, err
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		s.tasks, _ = parseLoadavgTasks(b)
	}
	if n, err := readFirstInt("/proc/sys/fs/file-nr"); err == nil {
		s.files = n
	}
	if b, err := os.ReadFile("/proc/net/stat/arp_cache"); err != nil {
		s.neighErr = err
	} else {
		s.neigh, s.neighErr = parseArpCache(b)
	}
	if ents, err := os.ReadDir("/sys/class/net"); err == nil {
		s.ifaces = len(ents)
	}
	if b, err := os.ReadFile("/proc/cgroups"); err == nil {
		if n, err := parseCgroupCount(b, "memory"); err == nil {
			s.memcgs = n
		}
	}
	mountinfos := []string{"/proc/1/mountinfo"}
	if pid, err := serverPID(api, procs); err != nil {
		s.serverErr = err
	} else if c, ok, err := readProcCounts(pid); err != nil || !ok {
		s.serverErr = fmt.Errorf("server process %d: ended or unreadable (%v)", pid, err)
	} else {
		s.server = c
		mi := fmt.Sprintf("/proc/%d/mountinfo", pid)
		mountinfos = append(mountinfos, mi)
		s.serverMounts, _ = countLines(mi)
		for _, h := range helperPIDs(pid, procs) {
			if c, ok, _ := readProcCounts(h); ok {
				s.helpers++
				s.helper = maxCounts(s.helper, c)
			}
		}
	}
	s.netns = netNamespaces(procs, mountinfos...)
	s.nftLines, s.nftChains, s.nftList, s.nftErr = nftRuleset(ctx)

	boxes, err := pidsOf(procs)
	if err != nil {
		return s, err
	}
	var sum int
	for _, pids := range boxes {
		n := 0
		for _, pid := range pids {
			c, ok, err := readProcCounts(pid)
			if err != nil {
				return s, err
			}
			if !ok {
				continue
			}
			n += c.threads
			if c.fds > s.procMax.fds {
				s.procMaxFdsLimit = c.nofile
			}
			s.procMax = maxCounts(s.procMax, c)
		}
		s.sandboxes++
		sum += n
		s.threadsMax = max(s.threadsMax, n)
	}
	if s.sandboxes > 0 {
		s.threadsMean = float64(sum) / float64(s.sandboxes)
	}
	return s, nil
}

// maxCounts takes each count's larger value.
func maxCounts(a, b procCounts) procCounts {
	return procCounts{threads: max(a.threads, b.threads), fds: max(a.fds, b.fds), maps: max(a.maps, b.maps), nofile: max(a.nofile, b.nofile)}
}

// nftRuleset lists the host's nftables ruleset and counts its lines and
// chains; the time the listing takes grows with the ruleset, and agentenv
// changes rules on the create and kill paths.
func nftRuleset(ctx context.Context) (lines, chains int, took time.Duration, err error) {
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, "nft", "list", "ruleset")
	cmd.Stdout, cmd.Stderr = &out, &errOut
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return 0, 0, 0, fmt.Errorf("nft list ruleset: %w: %s", err, bytes.TrimSpace(errOut.Bytes()))
	}
	took = time.Since(start)
	for _, line := range bytes.Split(out.Bytes(), []byte("\n")) {
		if bytes.HasPrefix(bytes.TrimSpace(line), []byte("chain ")) {
			chains++
		}
	}
	return bytes.Count(out.Bytes(), []byte("\n")), chains, took, nil
}

// memoryUse is the host memory part of the probe, from the density row.
type memoryUse struct {
	availableMiB float64 // MemAvailable before the first sandbox
	dropMiB      float64 // MemAvailable drop with all of them up
}

// buildLimits turns two samples, before and with n sandboxes up, into
// rows. It is pure: the tests feed it samples.
func buildLimits(before, after hostSample, n int, lim hostLimits, mem memoryUse) (*Limits, []string) {
	l := &Limits{Sandboxes: n}
	var notes []string
	grows := func(key, label string, b, a int, limit int, limitName string) {
		if b < 0 || a < 0 {
			return
		}
		l.Rows = append(l.Rows, linearRow(key, label, float64(b), float64(a), n, float64(limit), limitName))
	}
	perProcess := func(key, label string, v float64, limit int, limitName string) {
		l.Rows = append(l.Rows, LimitRow{Key: key, Label: label, PerProcess: true, After: v, At10x: v, Limit: float64(limit), LimitName: limitName})
	}

	threadLimit, threadLimitName := lim.pidMax, "kernel.pid_max"
	if lim.threadsMax > 0 && (threadLimit <= 0 || lim.threadsMax < threadLimit) {
		threadLimit, threadLimitName = lim.threadsMax, "kernel.threads-max"
	}
	grows("host_threads", "threads on the host (all processes)", before.tasks, after.tasks, threadLimit, threadLimitName)
	if after.sandboxes > 0 && before.tasks >= 0 {
		// The sandboxes' own threads, counted per sandbox rather than as a
		// difference of host totals (which other jobs move), against what
		// the limit leaves after the threads already on the host.
		label := fmt.Sprintf("threads of the sandboxes' processes (most %d per sandbox)", after.threadsMax)
		name := fmt.Sprintf("%s less the %d threads on the host before", threadLimitName, before.tasks)
		l.Rows = append(l.Rows, linearRow("sandbox_threads", label, 0, after.threadsMean*float64(after.sandboxes), n, float64(threadLimit-before.tasks), name))
	}
	serverOK := before.server.pid != 0 && after.server.pid != 0
	if serverOK {
		grows("server_threads", "threads of the server process", before.server.threads, after.server.threads, goMaxThreads, "Go's SetMaxThreads default")
	}
	if before.helpers > 0 || after.helpers > 0 {
		grows("helper_threads", fmt.Sprintf("threads of the busiest helper process (of %d)", after.helpers), before.helper.threads, after.helper.threads, goMaxThreads, "Go's SetMaxThreads default")
	}
	if serverOK {
		grows("server_fds", "open files of the server process", before.server.fds, after.server.fds, after.server.nofile, "its RLIMIT_NOFILE")
	}
	if before.helpers > 0 || after.helpers > 0 {
		grows("helper_fds", "open files of the busiest helper process", before.helper.fds, after.helper.fds, after.helper.nofile, "its RLIMIT_NOFILE")
	}
	if after.sandboxes > 0 {
		perProcess("sandbox_proc_fds", "open files of one sandbox process (most)", float64(after.procMax.fds), after.procMaxFdsLimit, "its RLIMIT_NOFILE")
	}
	grows("host_files", "open files on the host (fs/file-nr)", before.files, after.files, lim.fileMax, "fs.file-max")
	if serverOK {
		grows("server_maps", "memory maps of the server process", before.server.maps, after.server.maps, lim.maxMapCount, "vm.max_map_count (per process)")
	}
	if before.helpers > 0 || after.helpers > 0 {
		grows("helper_maps", "memory maps of the busiest helper process", before.helper.maps, after.helper.maps, lim.maxMapCount, "vm.max_map_count (per process)")
	}
	if after.sandboxes > 0 {
		perProcess("sandbox_proc_maps", "memory maps of one sandbox process (most)", float64(after.procMax.maps), lim.maxMapCount, "vm.max_map_count (per process)")
	}
	if before.nftErr == nil && after.nftErr == nil {
		grows("nft_lines", "nftables ruleset, lines (host)", before.nftLines, after.nftLines, 0, "")
		grows("nft_chains", "nftables chains (host)", before.nftChains, after.nftChains, 0, "")
		l.Rows = append(l.Rows, linearRow("nft_list_ms", "`nft list ruleset` (ms)", ms(before.nftList), ms(after.nftList), n, 0, ""))
	} else {
		notes = append(notes, fmt.Sprintf("limits: nftables not counted: %v", cmpErr(before.nftErr, after.nftErr)))
	}
	grows("host_ifaces", "network interfaces on the host", before.ifaces, after.ifaces, 0, "")
	if before.neighErr == nil && after.neighErr == nil {
		// One table for every namespace; past gc_thresh3 entries, a new
		// one (a connection to a sandbox whose entry aged out) fails.
		grows("neigh_entries", "neighbour (ARP) entries, all namespaces", before.neigh.entries, after.neigh.entries, lim.neighMax, "net.ipv4.neigh.default.gc_thresh3")
		grows("neigh_table_fulls", "neighbour table full (entries refused, count)", before.neigh.tableFulls, after.neigh.tableFulls, 0, "")
	} else {
		notes = append(notes, fmt.Sprintf("limits: neighbour table not counted: %v", cmpErr(before.neighErr, after.neighErr)))
	}
	grows("netns", "network namespaces", before.netns, after.netns, lim.maxNetNS, "user.max_net_namespaces")
	grows("memcgs", "memory cgroups (/proc/cgroups)", before.memcgs, after.memcgs, memcgIDMax, "cgroup v1 memcg IDs")
	if serverOK {
		grows("server_mounts", "mounts in the server's mount namespace", before.serverMounts, after.serverMounts, lim.mountMax, "fs.mount-max")
	}
	if mem.availableMiB > 0 {
		l.Rows = append(l.Rows, linearRow("memory_mib", "host memory used (MemAvailable drop, MiB)", 0, mem.dropMiB, n, mem.availableMiB, "MemAvailable before"))
	}
	if !serverOK {
		notes = append(notes, fmt.Sprintf("limits: server process not found, its rows left out: %v", cmpErr(before.serverErr, after.serverErr)))
	}
	for _, r := range l.Rows {
		if r.ReachedAt > 0 && (l.First == "" || r.ReachedAt < l.FirstReachedAt) {
			l.First, l.FirstReachedAt = r.Key, r.ReachedAt
		}
	}
	return l, notes
}

// linearRow extrapolates a total that was before with no sandboxes and
// after with n.
func linearRow(key, label string, before, after float64, n int, limit float64, limitName string) LimitRow {
	r := LimitRow{Key: key, Label: label, Before: before, After: after, Limit: limit, LimitName: limitName}
	if limit <= 0 {
		r.LimitName = ""
	}
	r.At10x = before + 10*(after-before)
	if n > 0 {
		r.PerSandbox = (after - before) / float64(n)
	}
	if limit > 0 && r.PerSandbox > 0 {
		r.ReachedAt = math.Max(0, (limit-before)/r.PerSandbox)
	}
	return r
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// limitsProbe takes the first sample before the density row's sandboxes
// start and the second with all of them up.
type limitsProbe struct {
	api    string
	t      densityTarget
	before hostSample
	after  hostSample
	n      int
	done   bool
}

func (p *limitsProbe) sampleBefore(ctx context.Context) error {
	s, err := sampleHost(ctx, p.api, func(map[int]proc) ([][]int, error) { return nil, nil })
	p.before = s
	return err
}

// sampleAfter is the density row's probe hook: ids are the sandboxes up.
func (p *limitsProbe) sampleAfter(ctx context.Context, ids []string) error {
	s, err := sampleHost(ctx, p.api, func(procs map[int]proc) ([][]int, error) {
		var out [][]int
		for _, id := range ids {
			pids, err := p.t.pidsIn(ctx, procs, id)
			if err != nil {
				return nil, err
			}
			out = append(out, pids)
		}
		return out, nil
	})
	if err != nil {
		return err
	}
	p.after, p.n, p.done = s, len(ids), true
	return nil
}

// report builds the rows; ok is false when the second sample was not
// taken.
func (p *limitsProbe) report(d DensityRun) (*Limits, []string, bool) {
	if !p.done {
		return nil, nil, false
	}
	l, notes := buildLimits(p.before, p.after, p.n, readHostLimits(), memoryUse{availableMiB: d.MemAvailableBeforeMiB, dropMiB: d.MemAvailableDropMiB})
	return l, notes, true
}
