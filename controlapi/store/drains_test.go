package store

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"cellvisor/controlapi/adminapi"
	"cellvisor/manifest"
)

// held publishes domains into pool until at least want of them are
// placed on cell, and returns those.
func heldOn(t *testing.T, s *Store, edge, pool, cell string, n int) []string {
	t.Helper()
	var on []string
	for i := 0; len(on) < n; i++ {
		if i > 200 {
			t.Fatalf("no domain landed on %s", cell)
		}
		d := fmt.Sprintf("d%d.example", i)
		if _, err := s.PublishDomain(ctx(t), d, pool, nil, bytes([]byte(d))); err != nil {
			t.Fatal(err)
		}
		if slices.Contains(cellsOn(t, s, edge, d), cell) {
			on = append(on, d)
		}
	}
	return on
}

// minCells is the fewest cells any of domains has in any of the edge's
// sequences from..its current one.
func minCells(t *testing.T, s *Store, edge string, from int64, domains []string) (int, string) {
	t.Helper()
	least, where := 1<<30, ""
	for seq := from; seq <= mustEdge(t, s, edge).Sequence; seq++ {
		es, err := s.Entries(ctx(t), edge, seq, "", 500)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range domains {
			n := 0
			for _, e := range es {
				if e.Domain == d {
					n = len(e.Cells)
				}
			}
			if n < least {
				least, where = n, fmt.Sprintf("%s at sequence %d", d, seq)
			}
		}
	}
	return least, where
}

func steps(d Drain) []string {
	var out []string
	for _, st := range d.Steps {
		out = append(out, st.Step)
	}
	return out
}

// drainCell changes cell to pool through a drain and drives it to its
// end, checking that its domains never have fewer cells than replicas in
// any sequence and that the cell holds them until it is let go.
func drainCell(t *testing.T, s *Store, edge, cell, pool string, replicas int, domains []string) Drain {
	t.Helper()
	from := mustEdge(t, s, edge).Sequence
	before, _ := s.Assignments(ctx(t), edge)
	_, d, err := s.ChangeCell(ctx(t), edge, cell, pool, time.Hour, fakeSign)
	if err != nil || d == nil || d.State != adminapi.MoveWaiting || !slices.Equal(d.Domains, domains) {
		t.Fatalf("change %s: drain %+v, %v", cell, d, err)
	}
	for _, dom := range domains {
		if got := cellsOn(t, s, edge, dom); len(got) != replicas+1 || !slices.Contains(got, cell) {
			t.Fatalf("while %s drains %s's entry names %v: want it and %d new cell(s)", cell, dom, got, replicas)
		}
	}
	// A new domain is not placed on a draining cell.
	if _, err := s.PublishDomain(ctx(t), "late.example", before[cell], nil, bytes([]byte("late"))); err != nil {
		t.Fatal(err)
	}
	if got := cellsOn(t, s, edge, "late.example"); slices.Contains(got, cell) {
		t.Fatalf("a new domain went to the draining %s: %v", cell, got)
	}
	// Not applied yet: it waits and the cell stays assigned.
	if got, waiting, err := s.StepDrain(ctx(t), edge, cell, fakeSign); err != nil || got.State != adminapi.MoveWaiting || waiting == "" {
		t.Fatalf("before the ack: %+v, %q, %v", got, waiting, err)
	}
	// A second change of the draining cell is refused.
	if _, _, err := s.ChangeCell(ctx(t), edge, cell, "", time.Hour, fakeSign); !errors.Is(err, ErrConflict) {
		t.Fatalf("a second change while draining: %v", err)
	}
	cells := []string{"cell-01", "cell-02", "cell-03", "cell-04", "cell-05"}
	report(t, s, edge, cells...)
	got, _, err := s.StepDrain(ctx(t), edge, cell, fakeSign)
	if err != nil || got.State != adminapi.MoveDraining {
		t.Fatalf("switch: %+v, %v", got, err)
	}
	if a, _ := s.Assignments(ctx(t), edge); a[cell] != before[cell] {
		t.Fatalf("%s reassigned before its domains left it: %v", cell, a)
	}
	for _, dom := range domains {
		if got := cellsOn(t, s, edge, dom); !slices.Contains(got, cell) {
			t.Fatalf("%s left %s before the drain interval: %v", dom, cell, got)
		}
	}
	s.Now = func() time.Time { return time.Now().Add(2 * time.Minute) }
	defer func() { s.Now = time.Now }()
	got, _, err = s.StepDrain(ctx(t), edge, cell, fakeSign)
	if err != nil || got.State != adminapi.MoveDone {
		t.Fatalf("finish: %+v, %v", got, err)
	}
	if want := []string{"started", "placed", "delivering", "applied", "switched", "drained"}; !slices.Equal(steps(got), want) {
		t.Errorf("steps %v, want %v", steps(got), want)
	}
	if a, _ := s.Assignments(ctx(t), edge); a[cell] != pool {
		t.Fatalf("after the drain %s is %q, want %q", cell, a[cell], pool)
	}
	for _, dom := range domains {
		if got := cellsOn(t, s, edge, dom); len(got) != replicas || slices.Contains(got, cell) {
			t.Fatalf("after the drain %s is on %v", dom, got)
		}
	}
	if n, where := minCells(t, s, edge, from, domains); n < replicas {
		t.Fatalf("%s had %d cell(s), fewer than its %d replica(s)", where, n, replicas)
	}
	return got
}

func TestUnassignCellMovesItsDomainsFirst(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		a := newEdge(t, s, "a")
		reserved(t, s, "reserved-eu", 1, 0)
		assign(t, s, a.ID, "cell-03", "reserved-eu")
		assign(t, s, a.ID, "cell-04", "reserved-eu")
		domains := heldOn(t, s, a.ID, "reserved-eu", "cell-03", 3)
		drainCell(t, s, a.ID, "cell-03", "", 1, domains)
	})
}

func TestReassignCellMovesItsDomainsFirst(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		a := newEdge(t, s, "a")
		reserved(t, s, "reserved-eu", 2, 0)
		us := DefaultPool("reserved-us", "reserved")
		us.MinReady = 0 // the test's status reports name no pool
		if _, err := s.CreatePool(ctx(t), us); err != nil {
			t.Fatal(err)
		}
		for _, c := range []string{"cell-03", "cell-04", "cell-05"} {
			assign(t, s, a.ID, c, "reserved-eu")
		}
		domains := heldOn(t, s, a.ID, "reserved-eu", "cell-03", 2)
		drainCell(t, s, a.ID, "cell-03", "reserved-us", 2, domains)
		// The reassigned cell takes the other pool's domains.
		if _, err := s.PublishDomain(ctx(t), "us.example", "reserved-us", nil, bytes([]byte("us"))); err != nil {
			t.Fatal(err)
		}
		if got := cellsOn(t, s, a.ID, "us.example"); !slices.Equal(got, []string{"cell-03"}) {
			t.Fatalf("reserved-us domain on %v", got)
		}
	})
}

func TestUnassignRefusedWithNowhereToGo(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		a := newEdge(t, s, "a")
		reserved(t, s, "reserved-small", 1, 1)
		assign(t, s, a.ID, "cell-03", "reserved-small")
		assign(t, s, a.ID, "cell-04", "reserved-small")
		for _, d := range []string{"one.example", "two.example"} {
			if _, err := s.PublishDomain(ctx(t), d, "reserved-small", nil, bytes([]byte(d))); err != nil {
				t.Fatal(err)
			}
		}
		one := cellsOn(t, s, a.ID, "one.example")[0]
		seq := mustEdge(t, s, a.ID).Sequence
		_, d, err := s.ChangeCell(ctx(t), a.ID, one, "", time.Hour, fakeSign)
		if !errors.Is(err, ErrUnavailable) || d != nil || !strings.Contains(err.Error(), "one.example") || !strings.Contains(err.Error(), "at most 1 domain(s) a cell") {
			t.Fatalf("unassign with the other cell at the bound: %+v, %v", d, err)
		}
		// Nothing changed.
		if got := mustEdge(t, s, a.ID).Sequence; got != seq {
			t.Errorf("a refused change advanced the sequence %d → %d", seq, got)
		}
		if as, _ := s.Assignments(ctx(t), a.ID); as[one] != "reserved-small" {
			t.Errorf("a refused change unassigned %s: %v", one, as)
		}
		if got := cellsOn(t, s, a.ID, "one.example"); !slices.Equal(got, []string{one}) {
			t.Errorf("a refused change moved one.example to %v", got)
		}
		if _, err := s.Drain(ctx(t), a.ID, one); !errors.Is(err, ErrNotFound) {
			t.Errorf("a refused change left a drain: %v", err)
		}
		// The only cell of a pool has nowhere to send its domains either.
		reserved(t, s, "reserved-lone", 1, 0)
		assign(t, s, a.ID, "cell-05", "reserved-lone")
		if _, err := s.PublishDomain(ctx(t), "lone.example", "reserved-lone", nil, bytes([]byte("l"))); err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.ChangeCell(ctx(t), a.ID, "cell-05", "reserved-small", time.Hour, fakeSign); !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "lone.example") {
			t.Fatalf("reassign the only cell: %v", err)
		}
		// An empty cell still changes at once.
		assign(t, s, a.ID, "cell-06", "reserved-lone")
		mustEdge(t, s, a.ID)
		es, d, err := s.ChangeCell(ctx(t), a.ID, "cell-06", "", time.Hour, fakeSign)
		if err != nil || d != nil || es.Sequence != mustEdge(t, s, a.ID).Sequence {
			t.Fatalf("unassign an empty cell: %+v %+v %v", es, d, err)
		}
	})
}

// A new cell that refuses its domains fails the drain: the cell stays
// assigned with its domains, the new cells let them go.
func TestDrainFailsOnRefusal(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		a := newEdge(t, s, "a")
		reserved(t, s, "reserved-eu", 1, 0)
		assign(t, s, a.ID, "cell-03", "reserved-eu")
		assign(t, s, a.ID, "cell-04", "reserved-eu")
		domains := heldOn(t, s, a.ID, "reserved-eu", "cell-03", 1)
		es, _, err := s.ChangeCell(ctx(t), a.ID, "cell-03", "", time.Hour, fakeSign)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Ack(ctx(t), a.ID, manifest.Ack{Sequence: es.Sequence, Status: manifest.AckRefused, Reason: "artifact invalid", At: time.Now()}); err != nil {
			t.Fatal(err)
		}
		d, _, err := s.StepDrain(ctx(t), a.ID, "cell-03", fakeSign)
		if err != nil || d.State != adminapi.MoveFailed || !strings.Contains(d.Reason, "refused") {
			t.Fatalf("after a refusal: %+v, %v", d, err)
		}
		if as, _ := s.Assignments(ctx(t), a.ID); as["cell-03"] != "reserved-eu" {
			t.Errorf("a failed drain unassigned the cell: %v", as)
		}
		if got := cellsOn(t, s, a.ID, domains[0]); !slices.Equal(got, []string{"cell-03"}) {
			t.Errorf("after a failed drain %s is on %v", domains[0], got)
		}
	})
}
