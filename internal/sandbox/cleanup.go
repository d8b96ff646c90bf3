package sandbox

import (
	"github.com/agentenv/agentenv/internal/netns"
)

// undo is what a box (a sandbox, or a warm container) holds, as a stack of
// the steps that give it back: each boot step that acquires something
// pushes its undo (boot.go). A failed boot, a kill and a pause without
// memory run it: in reverse, under a context the caller's cancellation
// cannot cut short, stopping at the first step that fails and keeping it
// and those below for the next run — so a container that failed to go
// keeps its network slot, and a retry resumes where the last run stopped.
type undo struct {
	id    string
	steps []undoStep
}

// undoKind names what an undo step gives back. Teardown is written once,
// in reaper.undoOne.
type undoKind string

const (
	undoRelease   undoKind = "release"   // a reference (template, snapshot, disk claim): fn
	undoDir       undoKind = "dir"       // the box's directory (record, bundle, logs, layer)
	undoSlot      undoKind = "slot"      // its network slot
	undoContainer undoKind = "container" // its runtime container (a no-op when none was made)
	undoListed    undoKind = "listed"    // its place in the registry
)

type undoStep struct {
	kind undoKind
	name string // what a release gives back, for errors
	slot netns.Slot
	fn   func()
}

func (u *undo) push(s undoStep) { u.steps = append(u.steps, s) }

func (u *undo) has(kind undoKind) bool {
	for _, s := range u.steps {
		if s.kind == kind {
			return true
		}
	}
	return false
}

// moveTo puts u's steps on top of dst's and empties u.
func (u *undo) moveTo(dst *undo) {
	dst.steps = append(dst.steps, u.steps...)
	u.steps = nil
}

func containsKind(kinds []undoKind, k undoKind) bool {
	for _, x := range kinds {
		if x == k {
			return true
		}
	}
	return false
}

// recordUndo is the undo of a sandbox that exists already (adopted after a
// restart, or torn down from its record): all a sandbox holds.
func recordUndo(sb Sandbox, release func()) undo {
	u := undo{id: sb.ID}
	if release != nil {
		u.push(undoStep{kind: undoRelease, name: "template", fn: release})
	}
	u.push(undoStep{kind: undoDir})
	if sb.Slot.Namespace != "" {
		u.push(undoStep{kind: undoSlot, slot: sb.Slot})
	}
	u.push(undoStep{kind: undoContainer})
	u.push(undoStep{kind: undoListed})
	return u
}
