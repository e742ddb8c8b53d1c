package activation

import (
	"cellvisor/runtime"
)

// slotView is what one slot has and would get: the input of plan. apply
// gathers it (building each assigned slot's release, reading its active one
// and asking its cell what it loaded); plan decides from it alone.
type slotView struct {
	slot runtime.Slot
	pool string // "" when unassigned
	// before is the slot's pool before this manifest ("" when unassigned).
	before string
	// next is the release built for the new sequence (unassigned: zero).
	next runtime.Release
	// current is the slot's active release; hasCurrent is false when it has
	// none (a new slot, or one whose release was lost).
	current    runtime.ReleaseMeta
	hasCurrent bool
	// loaded is the sequence the cell reports having loaded, valid only when
	// running (a running, ready or drained cell that answered).
	loaded  int64
	running bool
}

// changeKind is what activation does to one slot.
type changeKind int

const (
	// untouched: nothing to do (unassigned, or unchanged and loaded, or
	// unchanged and its cell not running to say otherwise).
	untouched changeKind = iota
	// install: a new release is installed, switched in, and its cell
	// reloaded until it reports the new sequence.
	install
	// reload: the release is unchanged but the running cell has not loaded
	// it (an earlier reload failed, acked as partial); it is reloaded until
	// it reports the active release's sequence.
	reload
	// retire: the slot is no longer assigned but has a runtime: its cell
	// is drained and stopped, and its runtime emptied.
	retire
)

func (k changeKind) String() string {
	return [...]string{"untouched", "install", "reload", "retire"}[k]
}

// change is one slot's part of a plan.
type change struct {
	slot    runtime.Slot
	kind    changeKind
	release runtime.Release // install only
	// want is the sequence the cell must report once reloaded (0: untouched).
	want int64
}

// plan decides, for a manifest of sequence seq, what happens to every slot:
// a slot whose new release has the content (digest) and pool of its active
// one is not reinstalled, and is reloaded only when its running cell reports
// another sequence than the active release's; every other assigned slot
// (a changed one, a newly assigned one, one reassigned to another pool) gets
// the new release; an unassigned slot that was assigned, or still has a
// runtime or a running cell, is retired. It returns one change per view, in the views' order (slot
// order), and does nothing itself.
func plan(seq int64, views []slotView) []change {
	out := make([]change, len(views))
	for i, v := range views {
		out[i] = change{slot: v.slot, kind: untouched}
		switch {
		case v.pool == "":
			if v.hasCurrent || v.running || v.before != "" {
				out[i].kind = retire
			}
		case v.hasCurrent && v.current.Digest == v.next.Meta.Digest && v.current.Pool == v.pool:
			if v.running && v.loaded != v.current.Sequence {
				out[i].kind, out[i].want = reload, v.current.Sequence
			}
		default:
			out[i].kind, out[i].release, out[i].want = install, v.next, seq
		}
	}
	return out
}
