package bench

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func sampleFixture() (before, after hostSample) {
	before = hostSample{
		tasks: 1000, files: 3000, ifaces: 20, netns: 50, memcgs: 200,
		neigh:    neighStats{entries: 24, tableFulls: 5},
		nftLines: 200, nftChains: 20, nftList: 5 * time.Millisecond,
		server: procCounts{pid: 10, threads: 12, fds: 30, maps: 90, nofile: 20000}, serverMounts: 40,
		helper: procCounts{pid: 11, threads: 9, fds: 20, maps: 80, nofile: 20000}, helpers: 2,
	}
	after = before
	after.tasks = 1000 + 100*20   // 20 threads per sandbox
	after.files = 3000 + 100*10   // 10 per sandbox
	after.server.fds = 30 + 100*2 // 2 per sandbox
	after.nftLines = 200 + 100*7
	after.nftChains = 20 + 100
	after.nftList = 25 * time.Millisecond
	after.netns = 50 + 100
	after.memcgs = 200 + 100
	after.serverMounts = 40 + 100
	after.ifaces = 20 + 100
	after.neigh = neighStats{entries: 24 + 2*100, tableFulls: 5}
	after.sandboxes, after.threadsMean, after.threadsMax = 100, 18, 25
	after.procMax = procCounts{threads: 11, fds: 25, maps: 50}
	after.procMaxFdsLimit = 20000
	return before, after
}

func TestBuildLimits(t *testing.T) {
	before, after := sampleFixture()
	lim := hostLimits{pidMax: 32768, threadsMax: 192730, fileMax: 2466170, maxMapCount: 65530, mountMax: 100000, maxNetNS: 96365, neighMax: 1024}
	l, notes := buildLimits(before, after, 100, lim, memoryUse{availableMiB: 20000, dropMiB: 1000})
	if len(notes) != 0 {
		t.Errorf("notes = %q, want none", notes)
	}
	rows := map[string]LimitRow{}
	for _, r := range l.Rows {
		rows[r.Key] = r
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-6 }
	tests := []struct {
		key                          string
		per, at10x, limit, reachedAt float64
	}{
		// pid_max is below threads-max: a thread takes a PID.
		{"host_threads", 20, 1000 + 1000*20, 32768, (32768 - 1000) / 20.0},
		// Counted per sandbox (18), not as the host difference (20).
		{"sandbox_threads", 18, 18 * 1000, 32768 - 1000, (32768 - 1000) / 18.0},
		{"server_fds", 2, 30 + 1000*2, 20000, (20000 - 30) / 2.0},
		{"host_files", 10, 3000 + 1000*10, 2466170, (2466170 - 3000) / 10.0},
		{"server_maps", 0, 90, 65530, 0}, // does not grow: never reached
		{"nft_lines", 7, 200 + 1000*7, 0, 0},
		{"nft_list_ms", 0.2, 5 + 10*20, 0, 0},
		{"netns", 1, 50 + 1000, 96365, 96365 - 50},
		{"memcgs", 1, 200 + 1000, 65535, 65535 - 200},
		{"server_mounts", 1, 40 + 1000, 100000, 100000 - 40},
		{"memory_mib", 10, 10000, 20000, 2000},
		// Two neighbour entries per sandbox (host and namespace side).
		{"neigh_entries", 2, 24 + 2000, 1024, (1024 - 24) / 2.0},
		{"neigh_table_fulls", 0, 5, 0, 0},
	}
	for _, tt := range tests {
		r, ok := rows[tt.key]
		if !ok {
			t.Errorf("no row %q", tt.key)
			continue
		}
		if !near(r.PerSandbox, tt.per) || !near(r.At10x, tt.at10x) || !near(r.Limit, tt.limit) || !near(r.ReachedAt, tt.reachedAt) {
			t.Errorf("row %s = per %v, 10x %v, limit %v, reached at %v; want %v, %v, %v, %v",
				tt.key, r.PerSandbox, r.At10x, r.Limit, r.ReachedAt, tt.per, tt.at10x, tt.limit, tt.reachedAt)
		}
	}
	if r := rows["sandbox_proc_maps"]; !r.PerProcess || r.At10x != 50 || r.ReachedAt != 0 {
		t.Errorf("per-process maps row = %+v, want 50 at 10x too, never reached", r)
	}
	// The neighbour table (at 500) before host threads (1588) and memory
	// (2000).
	if l.First != "neigh_entries" || !near(l.FirstReachedAt, 500) {
		t.Errorf("first limit = %s at %v, want neigh_entries at 500", l.First, l.FirstReachedAt)
	}
}

// Without a server process (another host) or nft, those rows are left out
// with a note, the rest stays.
func TestBuildLimitsPartial(t *testing.T) {
	before, after := sampleFixture()
	before.server, after.server = procCounts{}, procCounts{}
	before.helpers, after.helpers = 0, 0
	after.serverErr = errors.New("nothing on this host listens on port 3400")
	before.nftErr = errors.New("nft: not found")
	after.neighErr = errors.New("no /proc/net/stat/arp_cache")
	l, notes := buildLimits(before, after, 100, hostLimits{pidMax: 32768}, memoryUse{})
	for _, r := range l.Rows {
		if strings.HasPrefix(r.Key, "server_") || strings.HasPrefix(r.Key, "helper_") || strings.HasPrefix(r.Key, "nft_") || strings.HasPrefix(r.Key, "neigh_") || r.Key == "memory_mib" {
			t.Errorf("row %s printed without its source", r.Key)
		}
	}
	joined := strings.Join(notes, "\n")
	for _, want := range []string{"listens on port 3400", "nft: not found", "arp_cache"} {
		if !strings.Contains(joined, want) {
			t.Errorf("notes %q lack %q", notes, want)
		}
	}
	if l.First != "host_threads" {
		t.Errorf("first = %q, want host_threads", l.First)
	}
}
