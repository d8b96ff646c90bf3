package router

import (
	"slices"
	"strings"
)

// Candidate is a node as placement weighs it.
type Candidate struct {
	Name string
	// Sandboxes counts what it runs plus creates already sent its way.
	Sandboxes    int
	MaxSandboxes int
	FreeMemoryMB int64
	// MemoryMB is what the sandbox asks for (0: unknown).
	NeedMemoryMB int64
	// Holds: the template or snapshot is on the node already (no copy).
	Holds bool
}

// localityBonus is how much free room holding the template is worth: a
// node that has it wins unless it is more than a third fuller.
const localityBonus = 0.34

// Place orders the nodes to try for a new sandbox, best first: nodes
// that are full or short of memory are left out; the rest are ranked by
// free room (the free share of their sandbox slots), with a bonus for holding the template or
// snapshot already. Ties go to the node with more free memory, then by
// name, so the order is deterministic.
func Place(cands []Candidate) []string {
	type scored struct {
		Candidate
		score float64
	}
	var ok []scored
	for _, c := range cands {
		if c.MaxSandboxes > 0 && c.Sandboxes >= c.MaxSandboxes {
			continue
		}
		if c.NeedMemoryMB > 0 && c.FreeMemoryMB > 0 && c.FreeMemoryMB < c.NeedMemoryMB {
			continue
		}
		free := 1.0
		if c.MaxSandboxes > 0 {
			free = float64(c.MaxSandboxes-c.Sandboxes) / float64(c.MaxSandboxes)
		}
		if c.Holds {
			free += localityBonus
		}
		ok = append(ok, scored{c, free})
	}
	slices.SortFunc(ok, func(a, b scored) int {
		switch {
		case a.score > b.score:
			return -1
		case a.score < b.score:
			return 1
		case a.FreeMemoryMB > b.FreeMemoryMB:
			return -1
		case a.FreeMemoryMB < b.FreeMemoryMB:
			return 1
		}
		return strings.Compare(a.Name, b.Name)
	})
	out := make([]string, len(ok))
	for i, s := range ok {
		out[i] = s.Name
	}
	return out
}
