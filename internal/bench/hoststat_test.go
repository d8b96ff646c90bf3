package bench

import (
	"math"
	"slices"
	"testing"
)

func TestParseCPUTimes(t *testing.T) {
	// user nice system idle iowait irq softirq steal guest guest_nice
	stat := []byte("cpu  100 5 45 800 50 0 0 0 30 0\ncpu0 50 2 20 400 25 0 0 0 15 0\n")
	got, err := parseCPUTimes(stat)
	if err != nil {
		t.Fatal(err)
	}
	// guest is already in user: not counted twice.
	if want := (cpuTimes{busy: 150, total: 1000}); got != want {
		t.Errorf("parseCPUTimes = %+v, want %+v", got, want)
	}
	later := cpuTimes{busy: 150 + 90, total: 1000 + 100}
	if got := later.busySince(got); math.Abs(got-0.9) > 1e-9 {
		t.Errorf("busySince = %v, want 0.9", got)
	}
	if got := got.busySince(got); got != 0 {
		t.Errorf("busySince over no time = %v, want 0", got)
	}
	if _, err := parseCPUTimes([]byte("intr 1 2 3\n")); err == nil {
		t.Error("parseCPUTimes without a cpu line: got nil error, want one")
	}
}

func TestParseHostFiles(t *testing.T) {
	meminfo := []byte("MemTotal:       24684084 kB\nMemFree:        20810968 kB\nMemAvailable:   23976432 kB\n")
	if got, err := parseMeminfoKiB(meminfo, "MemAvailable"); err != nil || got != 23976432 {
		t.Errorf("MemAvailable = %d, %v; want 23976432", got, err)
	}
	if _, err := parseMeminfoKiB(meminfo, "SwapTotal"); err == nil {
		t.Error("missing meminfo field: got nil error, want one")
	}
	if got, err := parseLoadavgTasks([]byte("9.81 7.00 5.08 7/246 19408\n")); err != nil || got != 246 {
		t.Errorf("parseLoadavgTasks = %d, %v; want 246", got, err)
	}
	if got, err := firstInt([]byte("1787\t0\t2466170\n")); err != nil || got != 1787 {
		t.Errorf("firstInt(file-nr) = %d, %v; want 1787", got, err)
	}
	cgroups := []byte("#subsys_name\thierarchy\tnum_cgroups\tenabled\ncpuset\t3\t11\t1\nmemory\t4\t180\t1\n")
	if got, err := parseCgroupCount(cgroups, "memory"); err != nil || got != 180 {
		t.Errorf("parseCgroupCount(memory) = %d, %v; want 180", got, err)
	}
	limits := []byte("Limit                     Soft Limit           Hard Limit           Units     \n" +
		"Max processes             96365                96365                processes \n" +
		"Max open files            20000                40000                files     \n")
	if got, err := parseNofileSoft(limits); err != nil || got != 20000 {
		t.Errorf("parseNofileSoft = %d, %v; want the soft 20000", got, err)
	}
}

func TestListeningInodes(t *testing.T) {
	tcp := []byte(`  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:07E8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1050 1 0 100 0 0 10 0
   1: 0100007F:0D48 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1687184 2 0 100 0 0 10 0
   2: 0100007F:0D48 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 1687999 2 0 100 0 0 10 0
`)
	// 0x0D48 = 3400; the established connection (01) is not a listener.
	if got := listeningInodes(tcp, 3400); !slices.Equal(got, []string{"1687184"}) {
		t.Errorf("listeningInodes(3400) = %v, want [1687184]", got)
	}
	if got := listeningInodes(tcp, 3401); len(got) != 0 {
		t.Errorf("listeningInodes(3401) = %v, want none", got)
	}
}

func TestNsfsNetMounts(t *testing.T) {
	mi := []byte(`27 1 0:25 / /run rw,nosuid - tmpfs tmpfs rw
54 27 0:4 net:[4026532318] /run/agentenv/netns/agentenv-bh4-0 rw - nsfs nsfs rw
55 27 0:4 mnt:[4026532400] /run/x rw - nsfs nsfs rw
56 27 0:4 net:[4026533589] /run/agentenv/netns/agentenv-bh4-1 rw - nsfs nsfs rw
`)
	want := []string{"net:[4026532318]", "net:[4026533589]"}
	if got := nsfsNetMounts(mi); !slices.Equal(got, want) {
		t.Errorf("nsfsNetMounts = %v, want %v", got, want)
	}
}

func TestParseArpCache(t *testing.T) {
	b := []byte(`entries  allocs   destroys hash_grows lookups  hits     res_failed rcv_probes_mcast rcv_probes_ucast periodic_gc_runs forced_gc_runs unresolved_discards table_fulls
00000400 00002a06 000028e9 00000006   0000af2c 0000207d 000004dc   00000000         00000000         000000be         000001f7       00000000            000001a3
00000400 00002a12 00002b0d 00000003   0000ae0c 000021d7 00000583   00000000         00000000         00000000         0000023c       00000000            000001df
`)
	got, err := parseArpCache(b)
	if err != nil {
		t.Fatal(err)
	}
	// entries is table-wide; the events are per CPU and add up.
	if want := (neighStats{entries: 1024, forcedGCs: 0x1f7 + 0x23c, tableFulls: 0x1a3 + 0x1df}); got != want {
		t.Errorf("parseArpCache = %+v, want %+v", got, want)
	}
	if _, err := parseArpCache([]byte("entries allocs\n")); err == nil {
		t.Error("arp_cache without counters: got nil error, want one")
	}
}
