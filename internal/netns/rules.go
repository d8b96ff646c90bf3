package netns

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// A slot's egress policy lives in the server's table as a chain of fixed
// rules that look up the slot's own sets:
//
//	chain slotN {
//		ip saddr != <slot address> drop
//		ip daddr @slotN_explicit accept   # allowed inside blocked networks
//		ip daddr @blocked drop
//		ip daddr @slotN_allow accept      # other allowed networks
//		ip daddr @slotN_deny drop
//		iifname @internet accept          # the slot's interface, if Internet
//		drop
//	}
//
// plus the element "aeN : jump slotN" of the slots map while a sandbox
// holds the slot. The chain and sets are made once per slot; a policy
// change only refills the sets, in one netlink batch (atomic), without
// running nft (about 5 ms of CPU a run).

// slotRules is what this manager has put in its table for one slot. The
// table holds exactly that while the manager's record stands (it is reset
// when InstallFirewall replaces the table); mu serializes a slot's updates.
type slotRules struct {
	mu      sync.Mutex
	made    bool // chain, its rules and its sets exist
	filled  bool // the sets hold sets
	sets    egressSets
	applied bool // the slots map jumps to the chain
}

// egressSets is an Egress as a slot's sets hold it.
type egressSets struct {
	explicit, allow, deny []ipRange
	internet              bool
}

func (a egressSets) equal(b egressSets) bool {
	return a.internet == b.internet && slices.Equal(a.explicit, b.explicit) &&
		slices.Equal(a.allow, b.allow) && slices.Equal(a.deny, b.deny)
}

// ipRange is an inclusive range of IPv4 addresses.
type ipRange struct{ first, last uint32 }

// ranges turns prefixes into sorted, disjoint, non-adjacent ranges: the
// kernel refuses overlapping intervals in a set (nft's auto-merge does
// this for the sets it writes).
func ranges(ps []netip.Prefix) []ipRange {
	out := make([]ipRange, 0, len(ps))
	for _, p := range ps {
		if !p.Addr().Is4() {
			continue
		}
		p = p.Masked()
		a := p.Addr().As4()
		first := binary.BigEndian.Uint32(a[:])
		last := first | uint32(uint64(1)<<(32-p.Bits())-1)
		out = append(out, ipRange{first, last})
	}
	slices.SortFunc(out, func(x, y ipRange) int {
		return cmp.Or(cmp.Compare(x.first, y.first), cmp.Compare(x.last, y.last))
	})
	merged := out[:0]
	for _, r := range out {
		if n := len(merged); n > 0 && uint64(r.first) <= uint64(merged[n-1].last)+1 {
			merged[n-1].last = max(merged[n-1].last, r.last)
			continue
		}
		merged = append(merged, r)
	}
	return merged
}

// intervalElements encodes ranges the way nft does for an interval set: a
// leading end element at 0 when the first range starts later, a start
// element per range and an end element after it (none after the last
// address).
func intervalElements(rs []ipRange) []nftables.SetElement {
	var out []nftables.SetElement
	if len(rs) > 0 && rs[0].first != 0 {
		out = append(out, nftables.SetElement{Key: make([]byte, 4), IntervalEnd: true})
	}
	for _, r := range rs {
		out = append(out, nftables.SetElement{Key: binary.BigEndian.AppendUint32(nil, r.first)})
		if r.last != math.MaxUint32 {
			out = append(out, nftables.SetElement{Key: binary.BigEndian.AppendUint32(nil, r.last+1), IntervalEnd: true})
		}
	}
	return out
}

// ifname is an interface name as nftables keys it.
func ifname(name string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return b
}

// refuse is the verdict for what a policy forbids: the table's refuse
// chain, which rejects at once.
func refuse() *expr.Verdict { return &expr.Verdict{Kind: expr.VerdictGoto, Chain: "refuse"} }

func chainName(index int) string { return fmt.Sprintf("slot%d", index) }

// rulesBatch collects the messages of one netlink batch on the server's
// table. A Conn per batch: a Conn buffers messages, so goroutines cannot
// share one.
type rulesBatch struct {
	c   *nftables.Conn
	t   *nftables.Table
	err error
	// Set IDs name the sets made in this batch; numbered here because the
	// library's own counter is a global without a lock.
	ids uint32
}

func (m *Manager) newBatch() (*rulesBatch, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, err
	}
	return &rulesBatch{c: c, t: &nftables.Table{Name: m.table(), Family: nftables.TableFamilyINet}}, nil
}

func (b *rulesBatch) set(name string) *nftables.Set {
	return &nftables.Set{Table: b.t, Name: name}
}

func (b *rulesBatch) addElements(s *nftables.Set, els []nftables.SetElement) {
	if len(els) > 0 && b.err == nil {
		b.err = b.c.SetAddElements(s, els)
	}
}

func (b *rulesBatch) deleteElements(s *nftables.Set, els []nftables.SetElement) {
	if b.err == nil {
		b.err = b.c.SetDeleteElements(s, els)
	}
}

// slotSets are the names of a slot's sets, in the chain's order.
func slotSets(index int) (explicit, allow, deny string) {
	c := chainName(index)
	return c + "_explicit", c + "_allow", c + "_deny"
}

// make adds a slot's sets and its chain with the fixed rules (see the top
// of this file). Adding what exists is no error, and the chain is flushed
// first, so it is safe over a half-known table.
func (b *rulesBatch) make(slot Slot) {
	explicit, allow, deny := slotSets(slot.Index)
	ids := map[string]uint32{}
	for _, name := range []string{explicit, allow, deny} {
		b.ids++
		ids[name] = b.ids
		s := &nftables.Set{Table: b.t, Name: name, ID: b.ids, Interval: true, KeyType: nftables.TypeIPAddr}
		if b.err == nil {
			b.err = b.c.AddSet(s, nil)
		}
	}
	chain := b.c.AddChain(&nftables.Chain{Table: b.t, Name: chainName(slot.Index)})
	b.c.FlushChain(chain)
	ipv4 := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
	}
	daddr := func(set string, v *expr.Verdict) []expr.Any {
		return append(slices.Clone(ipv4),
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Lookup{SourceRegister: 1, SetName: set, SetID: ids[set]},
			v)
	}
	accept := &expr.Verdict{Kind: expr.VerdictAccept}
	saddr := slot.SandboxIP.To4()
	rules := [][]expr.Any{
		append(slices.Clone(ipv4),
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: saddr},
			&expr.Verdict{Kind: expr.VerdictDrop}),
		daddr(explicit, accept),
		daddr("blocked", refuse()),
		daddr(allow, accept),
		daddr(deny, refuse()),
		{
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
			&expr.Lookup{SourceRegister: 1, SetName: "internet"},
			&expr.Verdict{Kind: expr.VerdictAccept},
		},
		{refuse()},
	}
	for _, r := range rules {
		b.c.AddRule(&nftables.Rule{Table: b.t, Chain: chain, Exprs: r})
	}
}

// fill replaces what a slot's sets hold.
func (b *rulesBatch) fill(slot Slot, e egressSets) {
	explicit, allow, deny := slotSets(slot.Index)
	for _, s := range []struct {
		name string
		rs   []ipRange
	}{{explicit, e.explicit}, {allow, e.allow}, {deny, e.deny}} {
		set := b.set(s.name)
		b.c.FlushSet(set)
		b.addElements(set, intervalElements(s.rs))
	}
	b.internet(slot, e.internet)
}

// internet adds the slot's interface to the internet set or removes it
// (added first: deleting a missing element would fail the batch).
func (b *rulesBatch) internet(slot Slot, on bool) {
	el := []nftables.SetElement{{Key: ifname(slot.HostIf)}}
	b.addElements(b.set("internet"), el)
	if !on {
		b.deleteElements(b.set("internet"), el)
	}
}

// jump adds (or, with on false, removes) the slots map's element for the
// slot: its traffic goes through its chain, or is dropped.
func (b *rulesBatch) jump(slot Slot, on bool) {
	slots := &nftables.Set{Table: b.t, Name: "slots", IsMap: true}
	if on {
		b.addElements(slots, []nftables.SetElement{{Key: ifname(slot.HostIf),
			VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: chainName(slot.Index)}}})
		return
	}
	b.deleteElements(slots, []nftables.SetElement{{Key: ifname(slot.HostIf)}})
}

// remove deletes a slot's chain and sets (its map element must be gone or
// removed earlier in the batch).
func (b *rulesBatch) remove(slot Slot) {
	b.internet(slot, false)
	b.c.DelChain(&nftables.Chain{Table: b.t, Name: chainName(slot.Index)})
	explicit, allow, deny := slotSets(slot.Index)
	for _, name := range []string{explicit, allow, deny} {
		b.c.DelSet(b.set(name))
	}
}

func (b *rulesBatch) flush() error {
	if b.err != nil {
		return b.err
	}
	return b.c.Flush()
}

// slotRules returns the manager's record of a slot's rules.
func (m *Manager) slotRules(index int) *slotRules {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.rules == nil {
		m.rules = map[int]*slotRules{}
	}
	r := m.rules[index]
	if r == nil {
		r = &slotRules{}
		m.rules[index] = r
	}
	return r
}

// egressSets sorts an Egress into the slot's sets, against the blocked
// networks as they are now.
func (m *Manager) egressSets(e Egress) egressSets {
	blocked := m.Blocked()
	var explicit, other []netip.Prefix
	for _, p := range e.Allow {
		if insideAny(p, blocked) {
			explicit = append(explicit, p)
		} else {
			other = append(other, p)
		}
	}
	return egressSets{explicit: ranges(explicit), allow: ranges(other), deny: ranges(e.Deny), internet: e.Internet}
}

// update brings a slot's rules to want (made, filled with want, and
// jumped to if apply) in one batch, sending only what differs from the
// record. If the batch fails on a record that may be stale (someone
// changed the table), it starts over once from nothing known.
func (m *Manager) update(slot Slot, r *slotRules, want egressSets, apply bool) error {
	err := m.tryUpdate(slot, r, want, apply)
	if err != nil && (r.made || r.applied) {
		r.made, r.filled, r.applied = false, false, false
		err = m.tryUpdate(slot, r, want, apply)
	}
	return err
}

func (m *Manager) tryUpdate(slot Slot, r *slotRules, want egressSets, apply bool) error {
	refill := !r.filled || !r.sets.equal(want)
	if r.made && !refill && (r.applied || !apply) {
		return nil
	}
	b, err := m.newBatch()
	if err != nil {
		return err
	}
	if !r.made {
		b.make(slot)
	}
	if refill {
		b.fill(slot, want)
	}
	if apply && !r.applied {
		b.jump(slot, true)
	}
	if err := b.flush(); err != nil {
		return err
	}
	r.made, r.filled, r.sets = true, true, want
	r.applied = r.applied || apply
	return nil
}

// prepareEgress makes a new slot's chain and sets, holding the default
// policy but not yet applied, so that creating a sandbox with the default
// policy only adds the map element. It does nothing unless this manager
// installed the firewall; a failure is left to SetEgress to meet again.
func (m *Manager) prepareEgress(slot Slot) {
	m.fw.RLock()
	defer m.fw.RUnlock()
	m.mu.Lock()
	installed := m.rules != nil && m.installed
	m.mu.Unlock()
	if !installed {
		return
	}
	r := m.slotRules(slot.Index)
	r.mu.Lock()
	defer r.mu.Unlock()
	m.update(slot, r, m.egressSets(Egress{Internet: true}), false)
}

// removeEgress deletes a slot's chain and sets when the slot goes away.
// What the manager did not make (or no longer knows of) is left alone.
func (m *Manager) removeEgress(slot Slot) error {
	m.fw.RLock()
	defer m.fw.RUnlock()
	m.mu.Lock()
	r := m.rules[slot.Index]
	delete(m.rules, slot.Index)
	m.mu.Unlock()
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.made && !r.applied {
		return nil
	}
	b, err := m.newBatch()
	if err != nil {
		return err
	}
	if r.applied {
		b.jump(slot, false)
	}
	b.remove(slot)
	if err := b.flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("remove the egress rules of slot %d: %w", slot.Index, err)
	}
	r.made, r.filled, r.applied = false, false, false
	return nil
}
