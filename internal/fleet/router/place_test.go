package router

import (
	"fmt"
	"slices"
	"testing"
)

func TestPlace(t *testing.T) {
	// slots is a candidate with n of max sandbox slots in use and plenty
	// of memory.
	slots := func(name string, n, max int) Candidate {
		return Candidate{Name: name, Sandboxes: n, MaxSandboxes: max, FreeMemoryMB: 8192}
	}
	holds := func(c Candidate) Candidate { c.Holds = true; return c }
	mem := func(c Candidate, free, need int64) Candidate {
		c.FreeMemoryMB, c.NeedMemoryMB = free, need
		return c
	}

	tests := []struct {
		name  string
		cands []Candidate
		want  []string
	}{
		{"no nodes", nil, []string{}},
		{"every node full", []Candidate{slots("a", 10, 10), slots("b", 4, 4)}, []string{}},
		{"full nodes skipped",
			[]Candidate{slots("a", 10, 10), slots("b", 5, 10), slots("c", 11, 10)},
			[]string{"b"}},
		{"a full holder is skipped too",
			[]Candidate{holds(slots("a", 10, 10)), slots("b", 9, 10)},
			[]string{"b"}},
		{"no slot limit is never full",
			[]Candidate{slots("a", 1000, 0), slots("b", 1, 10)},
			[]string{"a", "b"}},
		{"memory-short nodes skipped",
			[]Candidate{mem(slots("a", 0, 10), 512, 1024), mem(slots("b", 5, 10), 2048, 1024), mem(slots("c", 1, 10), 1023, 1024)},
			[]string{"b"}},
		{"exactly enough memory is enough",
			[]Candidate{mem(slots("a", 0, 10), 1024, 1024)},
			[]string{"a"}},
		{"unknown free memory is not short",
			[]Candidate{mem(slots("a", 0, 10), 0, 1024)},
			[]string{"a"}},
		{"no memory asked: nothing is short",
			[]Candidate{mem(slots("a", 0, 10), 1, 0)},
			[]string{"a"}},
		{"a memory-short holder is skipped",
			[]Candidate{holds(mem(slots("a", 0, 10), 256, 512)), mem(slots("b", 9, 10), 4096, 512)},
			[]string{"b"}},
		{"most free room first",
			[]Candidate{slots("a", 8, 10), slots("b", 2, 10), slots("c", 5, 10), slots("d", 0, 10)},
			[]string{"d", "b", "c", "a"}},
		{"free room is a share of the node, not a count of slots",
			[]Candidate{slots("big", 40, 100), slots("small", 1, 10)},
			[]string{"small", "big"}},
		{"holder wins when a little fuller",
			[]Candidate{slots("a", 0, 100), holds(slots("h", 30, 100))},
			[]string{"h", "a"}},
		{"holder wins when exactly a third fuller",
			[]Candidate{slots("a", 0, 90), holds(slots("h", 30, 90))},
			[]string{"h", "a"}},
		{"holder loses when more than a third fuller",
			[]Candidate{slots("a", 0, 100), holds(slots("h", 35, 100))},
			[]string{"a", "h"}},
		{"holder loses to a node far emptier, beats a node as full",
			[]Candidate{slots("a", 10, 100), holds(slots("h", 60, 100)), slots("b", 60, 100)},
			[]string{"a", "h", "b"}},
		{"among holders, more free room first",
			[]Candidate{holds(slots("h1", 50, 100)), holds(slots("h2", 20, 100)), slots("a", 0, 100)},
			[]string{"h2", "a", "h1"}},
		{"tie: more free memory first",
			[]Candidate{mem(slots("a", 5, 10), 1000, 0), mem(slots("b", 5, 10), 3000, 0), mem(slots("c", 5, 10), 2000, 0)},
			[]string{"b", "c", "a"}},
		{"tie on room and memory: by name",
			[]Candidate{slots("n3", 5, 10), slots("n1", 5, 10), slots("n2", 5, 10)},
			[]string{"n1", "n2", "n3"}},
		{"same share of different sizes ties",
			[]Candidate{slots("z", 50, 100), slots("y", 5, 10)},
			[]string{"y", "z"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The order must not depend on the order nodes are listed in
			// (the cache lists them from a map).
			for i, cands := range orderings(tt.cands) {
				got := Place(cands)
				if got == nil {
					t.Fatalf("ordering %d: got nil, want an empty, non-nil slice", i)
				}
				if !slices.Equal(got, tt.want) {
					t.Errorf("ordering %d: got %q, want %q", i, got, tt.want)
				}
			}
		})
	}
}

// orderings returns cands as given, reversed and rotated.
func orderings(cands []Candidate) [][]Candidate {
	out := [][]Candidate{cands}
	rev := slices.Clone(cands)
	slices.Reverse(rev)
	out = append(out, rev)
	for i := 1; i < len(cands); i++ {
		out = append(out, append(slices.Clone(cands[i:]), cands[:i]...))
	}
	return out
}

// TestPlaceDoesNotModifyInput: the caller's slice is read only.
func TestPlaceDoesNotModifyInput(t *testing.T) {
	cands := []Candidate{
		{Name: "b", Sandboxes: 9, MaxSandboxes: 10},
		{Name: "a", Sandboxes: 1, MaxSandboxes: 10},
	}
	before := slices.Clone(cands)
	Place(cands)
	if !slices.Equal(cands, before) {
		t.Errorf("got %+v after Place, want %+v", cands, before)
	}
}

// TestPlaceLarge: a fleet of equal nodes is ranked by name, and one
// sandbox more moves a node behind all the others.
func TestPlaceLarge(t *testing.T) {
	var cands []Candidate
	for i := range 1000 {
		cands = append(cands, Candidate{Name: fmt.Sprintf("node-%04d", i), Sandboxes: 200, MaxSandboxes: 500, FreeMemoryMB: 20000})
	}
	cands[0].Sandboxes++
	got := Place(cands)
	if len(got) != 1000 {
		t.Fatalf("got %d nodes, want 1000", len(got))
	}
	if got[0] != "node-0001" || got[999] != "node-0000" {
		t.Errorf("got first %s and last %s, want node-0001 and node-0000", got[0], got[999])
	}
}
