package activation

import (
	"fmt"
	"testing"

	"cellvisor/runtime"
)

// TestPlan is the activation decision, pure: it runs without root, cells
// or files.
func TestPlan(t *testing.T) {
	const seq = 7
	rel := func(digest string) runtime.Release {
		return runtime.Release{Meta: runtime.ReleaseMeta{ID: fmt.Sprintf("%d-%s", seq, digest), Sequence: seq, Digest: digest}}
	}
	cur := func(s int64, pool, digest string) runtime.ReleaseMeta {
		return runtime.ReleaseMeta{Sequence: s, Pool: pool, Digest: digest}
	}
	type want struct {
		kind changeKind
		want int64
	}
	tests := []struct {
		name string
		view slotView
		want want
	}{
		{"unassigned slot is untouched",
			slotView{}, want{untouched, 0}},
		{"a slot unassigned with a release is retired",
			slotView{current: cur(3, "shared-default", "d1"), hasCurrent: true}, want{retire, 0}},
		{"a slot unassigned with a running cell and no release is retired",
			slotView{running: true}, want{retire, 0}},
		{"a slot unassigned while it waited for its first release is retired",
			slotView{before: "quarantine-default"}, want{retire, 0}},
		{"a newly assigned slot gets its pool's release",
			slotView{pool: "reserved-eu", next: rel("d1")}, want{install, seq}},
		{"a slot reassigned to another pool gets its new pool's release, even of equal content",
			slotView{pool: "reserved-eu", next: rel("d1"), current: cur(6, "shared-default", "d1"), hasCurrent: true, loaded: 6, running: true}, want{install, seq}},
		{"assigned slot with no release gets one",
			slotView{pool: "shared-default", next: rel("d1")}, want{install, seq}},
		{"changed content is installed",
			slotView{pool: "shared-default", next: rel("d2"), current: cur(6, "shared-default", "d1"), hasCurrent: true, loaded: 6, running: true}, want{install, seq}},
		{"same content is untouched and keeps its sequence",
			slotView{pool: "shared-default", next: rel("d1"), current: cur(6, "shared-default", "d1"), hasCurrent: true, loaded: 6, running: true}, want{untouched, 0}},
		{"same content under another pool is installed",
			slotView{pool: "reserved-a", next: rel("d1"), current: cur(6, "shared-default", "d1"), hasCurrent: true, loaded: 6, running: true}, want{install, seq}},
		{"a stale cell that did not load its unchanged release is reloaded to the active sequence",
			slotView{pool: "shared-default", next: rel("d1"), current: cur(6, "shared-default", "d1"), hasCurrent: true, loaded: 5, running: true}, want{reload, 6}},
		{"a stale cell still on nothing is reloaded",
			slotView{pool: "shared-default", next: rel("d1"), current: cur(6, "shared-default", "d1"), hasCurrent: true, loaded: 0, running: true}, want{reload, 6}},
		{"a cell that is not running cannot be stale: untouched",
			slotView{pool: "shared-default", next: rel("d1"), current: cur(6, "shared-default", "d1"), hasCurrent: true}, want{untouched, 0}},
		{"a drained cell (running, reporting) with changed content is installed like any other",
			slotView{pool: "quarantine-default", next: rel("d2"), current: cur(6, "quarantine-default", "d1"), hasCurrent: true, loaded: 6, running: true}, want{install, seq}},
		{"a stopped cell with changed content is installed (its start loads it)",
			slotView{pool: "shared-default", next: rel("d2"), current: cur(6, "shared-default", "d1"), hasCurrent: true}, want{install, seq}},
		{"a cell reporting a newer sequence than its unchanged release is reloaded back to it",
			slotView{pool: "shared-default", next: rel("d1"), current: cur(6, "shared-default", "d1"), hasCurrent: true, loaded: 9, running: true}, want{reload, 6}},
		{"a release equal to the new one but never active (no current) is installed",
			slotView{pool: "shared-default", next: rel("")}, want{install, seq}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.view.slot = runtime.Slot{Name: "cell-01"}
			got := plan(seq, []slotView{tc.view})
			if len(got) != 1 {
				t.Fatalf("plan returned %d changes for one slot", len(got))
			}
			c := got[0]
			if c.kind != tc.want.kind || c.want != tc.want.want {
				t.Errorf("got %s want %d, expected %s want %d", c.kind, c.want, tc.want.kind, tc.want.want)
			}
			if c.slot.Name != "cell-01" {
				t.Errorf("change for %q", c.slot.Name)
			}
			if c.kind == install && c.release.Meta.ID != tc.view.next.Meta.ID {
				t.Errorf("install of release %q, want the new one %q", c.release.Meta.ID, tc.view.next.Meta.ID)
			}
			if c.kind != install && c.release.Meta.ID != "" {
				t.Errorf("%s carries release %q", c.kind, c.release.Meta.ID)
			}
		})
	}
}

// TestPlanKeepsSlotOrder: reloads happen in slot order, whatever the mix.
func TestPlanKeepsSlotOrder(t *testing.T) {
	var views []slotView
	for i := 1; i <= 8; i++ {
		v := slotView{slot: runtime.Slot{Name: fmt.Sprintf("cell-%02d", i)}}
		if i%2 == 1 {
			v.pool, v.next.Meta.Digest = "shared-default", fmt.Sprint(i)
		}
		views = append(views, v)
	}
	got := plan(2, views)
	for i, c := range got {
		if c.slot.Name != views[i].slot.Name {
			t.Fatalf("change %d is for %s, want %s", i, c.slot.Name, views[i].slot.Name)
		}
		if wantKind := map[bool]changeKind{true: install, false: untouched}[i%2 == 0]; c.kind != wantKind {
			t.Errorf("%s: %s, want %s", c.slot.Name, c.kind, wantKind)
		}
	}
}
