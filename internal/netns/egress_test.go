package netns_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentenv/agentenv/internal/netns"
	"github.com/agentenv/agentenv/internal/testenv"
)

// cpuTime is the CPU (user + system) this process and its waited-for
// children (nft runs) have used so far, in microseconds.
func cpuTime(tb testing.TB) int64 {
	tb.Helper()
	var total int64
	for _, who := range []int{unix.RUSAGE_SELF, unix.RUSAGE_CHILDREN} {
		var ru unix.Rusage
		if err := unix.Getrusage(who, &ru); err != nil {
			tb.Fatal(err)
		}
		total += ru.Utime.Nano()/1000 + ru.Stime.Nano()/1000
	}
	return total
}

// BenchmarkEgress measures what a create and a kill cost the network
// slot's firewall: SetEgress then ClearEgress, wall time (ns/op) and CPU of
// every process involved (cpu-us/op).
//
//	AGENTENV_REQUIRE_ROOT=1 go test -run '^$' -bench Egress ./internal/netns/
func BenchmarkEgress(b *testing.B) {
	testenv.NeedRoot(b)
	m, err := netns.NewManager(testCIDR, testTag)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := m.InstallFirewall(ctx); err != nil {
		b.Fatalf("InstallFirewall: %v", err)
	}
	b.Cleanup(func() { m.RemoveFirewall(context.Background()) })
	m.Delete(ctx, m.SlotFor(20))
	slot, err := m.Create(ctx, 20)
	if err != nil {
		b.Fatalf("Create: %v", err)
	}
	b.Cleanup(func() { m.Delete(context.Background(), slot) })
	lists := []netns.Egress{{
		Allow: []netip.Prefix{netip.MustParsePrefix("10.1.2.0/24"), netip.MustParsePrefix("198.51.100.7/32")},
		Deny:  []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")},
	}, {
		Internet: true,
		Deny:     []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("203.0.113.9/32")},
	}}
	// Each create applies the policy of the op: the default every time
	// (most creates), or a policy unlike the slot's previous one.
	policies := []struct {
		name string
		e    func(i int) netns.Egress
	}{
		{"default", func(int) netns.Egress { return netns.Egress{Internet: true} }},
		{"lists", func(i int) netns.Egress { return lists[i%2] }},
	}
	for _, p := range policies {
		b.Run(p.name, func(b *testing.B) {
			start := cpuTime(b)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := m.SetEgress(ctx, slot, p.e(i)); err != nil {
					b.Fatalf("SetEgress: %v", err)
				}
				if err := m.ClearEgress(ctx, slot); err != nil {
					b.Fatalf("ClearEgress: %v", err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(cpuTime(b)-start)/float64(b.N), "cpu-us/op")
		})
	}
}

// ruleset is what `nft -j list table` shows of a manager's table: each
// set's elements (addresses, prefixes as a/n, ranges as a-b, names), the
// slots map (interface to chain) and the number of rules of each chain.
type ruleset struct {
	sets  map[string][]string
	slots map[string]string
	rules map[string]int
}

func listTable(t *testing.T, m *netns.Manager) ruleset {
	t.Helper()
	out, err := exec.Command(realNft, "-j", "list", "table", "inet", "agentenv"+testTag).Output()
	if err != nil {
		t.Fatalf("nft -j list table: %v", err)
	}
	var doc struct {
		Nftables []map[string]json.RawMessage `json:"nftables"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatalf("nft -j output: %v", err)
	}
	rs := ruleset{sets: map[string][]string{}, slots: map[string]string{}, rules: map[string]int{}}
	for _, obj := range doc.Nftables {
		for kind, raw := range obj {
			var o struct {
				Name  string            `json:"name"`
				Chain string            `json:"chain"`
				Elem  []json.RawMessage `json:"elem"`
			}
			if err := json.Unmarshal(raw, &o); err != nil {
				continue // metainfo
			}
			switch kind {
			case "set":
				els := []string{}
				for _, e := range o.Elem {
					els = append(els, elemString(t, e))
				}
				rs.sets[o.Name] = els
			case "map":
				for _, e := range o.Elem {
					var kv []json.RawMessage
					var v struct {
						Jump struct {
							Target string `json:"target"`
						} `json:"jump"`
					}
					if json.Unmarshal(e, &kv) != nil || len(kv) != 2 || json.Unmarshal(kv[1], &v) != nil {
						t.Fatalf("map %s element %s: want [key, {jump}]", o.Name, e)
					}
					rs.slots[elemString(t, kv[0])] = v.Jump.Target
				}
			case "chain":
				rs.rules[o.Name] += 0
			case "rule":
				rs.rules[o.Chain]++
			}
		}
	}
	return rs
}

// elemString reads a set element of nft's JSON: "a", {"prefix": ...},
// {"range": [...]} or {"elem": {"val": ...}}.
func elemString(t *testing.T, raw json.RawMessage) string {
	t.Helper()
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var o struct {
		Prefix *struct {
			Addr string `json:"addr"`
			Len  int    `json:"len"`
		} `json:"prefix"`
		Range []string `json:"range"`
		Elem  *struct {
			Val json.RawMessage `json:"val"`
		} `json:"elem"`
	}
	if err := json.Unmarshal(raw, &o); err != nil {
		t.Fatalf("set element %s: %v", raw, err)
	}
	switch {
	case o.Prefix != nil:
		return fmt.Sprintf("%s/%d", o.Prefix.Addr, o.Prefix.Len)
	case len(o.Range) == 2:
		return o.Range[0] + "-" + o.Range[1]
	case o.Elem != nil:
		return elemString(t, o.Elem.Val)
	}
	t.Fatalf("set element %s: unknown form", raw)
	return ""
}

// checkSlot compares a slot's objects in the table with a policy (nil: no
// policy in force).
func (rs ruleset) checkSlot(t *testing.T, slot netns.Slot, want *slotWant) {
	t.Helper()
	chain := fmt.Sprintf("slot%d", slot.Index)
	if got := rs.rules[chain]; got != 7 {
		t.Errorf("chain %s has %d rules, want 7", chain, got)
	}
	if want == nil {
		if target, ok := rs.slots[slot.HostIf]; ok {
			t.Errorf("slots map: %s jumps to %s, want no element (no policy)", slot.HostIf, target)
		}
		return
	}
	if got := rs.slots[slot.HostIf]; got != chain {
		t.Errorf("slots map: %s jumps to %q, want %s", slot.HostIf, got, chain)
	}
	for suffix, els := range map[string][]string{"_explicit": want.explicit, "_allow": want.allow, "_deny": want.deny} {
		got := slices.Sorted(slices.Values(rs.sets[chain+suffix]))
		if w := slices.Sorted(slices.Values(els)); !slices.Equal(got, w) {
			t.Errorf("set %s%s holds %v, want %v", chain, suffix, got, w)
		}
	}
	if got := slices.Contains(rs.sets["internet"], slot.HostIf); got != want.internet {
		t.Errorf("%s in the internet set: %v, want %v", slot.HostIf, got, want.internet)
	}
}

type slotWant struct {
	explicit, allow, deny []string
	internet              bool
}

func prefixes(s ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(s))
	for i, p := range s {
		out[i] = netip.MustParsePrefix(p)
	}
	return out
}

// installed returns the test manager with its firewall installed.
func installed(t *testing.T) *netns.Manager {
	t.Helper()
	m := newManager(t)
	if err := m.InstallFirewall(context.Background()); err != nil {
		t.Fatalf("InstallFirewall: %v", err)
	}
	t.Cleanup(func() { m.RemoveFirewall(context.Background()) })
	return m
}

func createSlot(t *testing.T, m *netns.Manager, index int) netns.Slot {
	t.Helper()
	slot, err := m.Create(context.Background(), index)
	if err != nil {
		t.Fatalf("Create(%d): %v", index, err)
	}
	t.Cleanup(func() { m.Delete(context.Background(), slot) })
	return slot
}

// A policy becomes the slot's sets: allowed networks inside blocked ones
// apart from the others, overlapping entries merged; replacing or clearing
// it leaves the chain's fixed rules alone; deleting the slot removes them.
func TestEgressRules(t *testing.T) {
	m := installed(t)
	ctx := context.Background()
	slot := createSlot(t, m, 12)
	listTable(t, m).checkSlot(t, slot, nil)
	steps := []struct {
		name string
		e    netns.Egress
		want slotWant
	}{
		{"lists", netns.Egress{
			Allow: prefixes("10.1.2.0/24", "10.1.3.0/24", "198.51.100.7/32", "198.51.100.0/30", "8.8.8.8/32"),
			Deny:  prefixes("203.0.113.0/24", "203.0.113.128/25", "224.0.0.0/3"),
		}, slotWant{explicit: []string{"10.1.2.0/23"}, allow: []string{"8.8.8.8", "198.51.100.0/30", "198.51.100.7"}, deny: []string{"203.0.113.0/24", "224.0.0.0/3"}}},
		{"catch-all", netns.Egress{Internet: true, Allow: prefixes("0.0.0.0/0", "169.254.169.254/32"), Deny: prefixes("0.0.0.0/0")},
			slotWant{explicit: []string{"169.254.169.254"}, allow: []string{"0.0.0.0/0"}, deny: []string{"0.0.0.0/0"}, internet: true}},
		{"default", netns.Egress{Internet: true}, slotWant{internet: true}},
		{"no internet", netns.Egress{}, slotWant{}},
	}
	for _, s := range steps {
		if err := m.SetEgress(ctx, slot, s.e); err != nil {
			t.Fatalf("%s: SetEgress: %v", s.name, err)
		}
		t.Run(s.name, func(t *testing.T) { listTable(t, m).checkSlot(t, slot, &s.want) })
	}
	// The kernel finds addresses in the sets as nft does.
	if err := m.SetEgress(ctx, slot, steps[0].e); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		set, addr string
		in        bool
	}{
		{"explicit", "10.1.3.255", true}, {"explicit", "10.1.4.0", false}, {"explicit", "10.1.1.255", false},
		{"allow", "198.51.100.3", true}, {"allow", "198.51.100.4", false}, {"allow", "8.8.8.8", true},
		{"deny", "255.255.255.255", true}, {"deny", "203.0.114.0", false}, {"deny", "1.1.1.1", false},
	} {
		set := fmt.Sprintf("slot%d_%s", slot.Index, c.set)
		err := exec.Command("nft", "get", "element", "inet", "agentenv"+testTag, set, "{ "+c.addr+" }").Run()
		if got := err == nil; got != c.in {
			t.Errorf("%s in %s: got %v, want %v", c.addr, set, got, c.in)
		}
	}
	if err := m.ClearEgress(ctx, slot); err != nil {
		t.Fatalf("ClearEgress: %v", err)
	}
	if err := m.ClearEgress(ctx, slot); err != nil {
		t.Fatalf("second ClearEgress: %v, want nil (idempotent)", err)
	}
	listTable(t, m).checkSlot(t, slot, nil)
	if err := m.Delete(ctx, slot); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	rs := listTable(t, m)
	for name := range rs.sets {
		if strings.HasPrefix(name, "slot12_") {
			t.Errorf("set %s left after Delete", name)
		}
	}
	if _, ok := rs.rules["slot12"]; ok || slices.Contains(rs.sets["internet"], slot.HostIf) {
		t.Errorf("chain slot12 or its internet element left after Delete: %+v", rs)
	}
}

// realNft is the nft that tests read the ruleset with, found before a test
// puts a fake one first in PATH.
var realNft = func() string {
	if p, err := exec.LookPath("nft"); err == nil {
		return p
	}
	return "nft"
}()

// fakeNft puts an nft first in PATH that records its calls and fails.
func fakeNft(t *testing.T) (calls func() string) {
	t.Helper()
	dir := t.TempDir()
	log := filepath.Join(dir, "calls")
	script := "#!/bin/sh\necho \"nft $*\" >> " + log + "\nexit 1\n"
	if err := os.WriteFile(filepath.Join(dir, "nft"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+":"+os.Getenv("PATH"))
	return func() string {
		b, _ := os.ReadFile(log)
		return string(b)
	}
}

// After InstallFirewall, a sandbox's create and kill (a slot from the
// pool or a new one, its policy, its release, a slot deleted when the pool
// is full) run no nft.
func TestEgressRunsNoNft(t *testing.T) {
	m := installed(t)
	ctx := context.Background()
	pool := netns.NewPool(m, 1, nil)
	ready := createSlot(t, m, 13)
	pool.MarkUsed(ready.Index)
	if err := pool.Put(ctx, ready); err != nil {
		t.Fatalf("Put: %v", err)
	}
	calls := fakeNft(t)
	policies := []netns.Egress{
		{Internet: true},
		{Allow: prefixes("10.9.0.0/16", "198.51.100.7/32"), Deny: prefixes("203.0.113.0/24")},
		{Internet: true},
		{Internet: true},
	}
	for i, e := range policies {
		slot, err := pool.Get(ctx)
		if err != nil {
			t.Fatalf("Get: %v", err)
		}
		if slot.Index != ready.Index {
			t.Fatalf("Get made slot %d, want the pooled %d", slot.Index, ready.Index)
		}
		if err := m.SetEgress(ctx, slot, e); err != nil {
			t.Fatalf("cycle %d: SetEgress: %v", i, err)
		}
		if err := m.Activate(ctx, slot); err != nil {
			t.Fatalf("cycle %d: Activate: %v", i, err)
		}
		if err := pool.Put(ctx, slot); err != nil {
			t.Fatalf("cycle %d: Put: %v", i, err)
		}
	}
	// Two at once: the pool makes a slot for the second, and has room
	// for only one of them back (the other is deleted, its rules with
	// it).
	var got []netns.Slot
	for range 2 {
		slot, err := pool.Get(ctx)
		if err != nil {
			t.Fatalf("Get: %v", err)
		}
		t.Cleanup(func() { m.Delete(context.Background(), slot) })
		if err := m.SetEgress(ctx, slot, policies[1]); err != nil {
			t.Fatal(err)
		}
		got = append(got, slot)
	}
	for _, slot := range got {
		if err := pool.Put(ctx, slot); err != nil {
			t.Fatalf("Put: %v", err)
		}
	}
	if c := calls(); c != "" {
		t.Errorf("create/kill cycles ran nft:\n%s", c)
	}
	if _, err := os.Stat(got[1].Path()); !os.IsNotExist(err) {
		t.Errorf("the slot Put into a full pool is still there: %v", err)
	}
	rs := listTable(t, m)
	if _, ok := rs.rules[fmt.Sprintf("slot%d", got[1].Index)]; ok {
		t.Errorf("the deleted slot %d keeps its chain", got[1].Index)
	}
	rs.checkSlot(t, got[0], nil)
}

// 16 sandboxes created and killed at once, on distinct slots: every slot
// ends with its own policy, whole, and nothing of another's.
func TestEgressConcurrent(t *testing.T) {
	m := installed(t)
	ctx := context.Background()
	const n = 16
	slots := make([]netns.Slot, n)
	for i := range slots {
		slots[i] = createSlot(t, m, 20+i)
	}
	policy := func(i, round int) (netns.Egress, slotWant) {
		e := netns.Egress{Internet: (i+round)%2 == 0,
			Allow: prefixes(fmt.Sprintf("10.%d.%d.0/24", i, round), fmt.Sprintf("198.51.%d.%d/32", 100+round, i)),
			Deny:  prefixes(fmt.Sprintf("203.0.%d.0/24", i))}
		return e, slotWant{internet: e.Internet,
			explicit: []string{fmt.Sprintf("10.%d.%d.0/24", i, round)},
			allow:    []string{fmt.Sprintf("198.51.%d.%d", 100+round, i)},
			deny:     []string{fmt.Sprintf("203.0.%d.0/24", i)}}
	}
	const rounds = 5
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i, slot := range slots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := range rounds {
				e, _ := policy(i, round)
				if err := m.SetEgress(ctx, slot, e); err != nil {
					errs <- fmt.Errorf("slot %d round %d: SetEgress: %w", slot.Index, round, err)
					return
				}
				if round == rounds-1 && i%4 != 0 {
					return // the sandbox stays; every fourth is killed
				}
				if err := m.ClearEgress(ctx, slot); err != nil {
					errs <- fmt.Errorf("slot %d round %d: ClearEgress: %w", slot.Index, round, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	rs := listTable(t, m)
	for i, slot := range slots {
		_, want := policy(i, rounds-1)
		if i%4 == 0 {
			rs.checkSlot(t, slot, nil)
		} else {
			rs.checkSlot(t, slot, &want)
		}
	}
	if len(rs.slots) != n-n/4 {
		t.Errorf("slots map has %d elements, want %d: %v", len(rs.slots), n-n/4, rs.slots)
	}
}

// BenchmarkSlot measures making and deleting a slot (what the pool does
// off the create path, and a create does when the pool is empty).
func BenchmarkSlot(b *testing.B) {
	testenv.NeedRoot(b)
	m, err := netns.NewManager(testCIDR, testTag)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := m.InstallFirewall(ctx); err != nil {
		b.Fatalf("InstallFirewall: %v", err)
	}
	b.Cleanup(func() { m.RemoveFirewall(context.Background()) })
	m.Delete(ctx, m.SlotFor(21))
	start := cpuTime(b)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		slot, err := m.Create(ctx, 21)
		if err != nil {
			b.Fatalf("Create: %v", err)
		}
		if err := m.Delete(ctx, slot); err != nil {
			b.Fatalf("Delete: %v", err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(cpuTime(b)-start)/float64(b.N), "cpu-us/op")
}
