package controlapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"cellvisor/controlapi"
	"cellvisor/controlapi/adminapi"
	"cellvisor/controlclient"
	"cellvisor/manifest"
)

func publishTo(t *testing.T, e *env, name, pool string) {
	t.Helper()
	if _, err := e.admin.Publish(ctx(t), name, adminapi.DomainRequest{Pool: pool, Config: json.RawMessage(fmt.Sprintf(demoConfig, name, "v1"))}); err != nil {
		t.Fatal(err)
	}
}

// cellsOf is each domain's cells in a manifest.
func cellsOf(m manifest.Manifest) map[string][]string {
	out := map[string][]string{}
	for _, en := range m.Entries {
		out[en.Domain] = en.Cells
	}
	return out
}

// awaitDrain polls edge show until the cell's drain is in state, bounded
// by the test's context.
func awaitDrain(t *testing.T, e *env, edge, cell, state string) adminapi.DrainView {
	t.Helper()
	var found adminapi.DrainView
	poll(t, func(c context.Context) (adminapi.EdgeView, error) { return e.admin.Edge(c, edge) },
		func(v adminapi.EdgeView) bool {
			for _, d := range v.Drains {
				if d.Cell == cell && d.State == state {
					found = d
					return true
				}
			}
			return false
		},
		func(v adminapi.EdgeView) string {
			return fmt.Sprintf("the drain of %s never got %s: %+v", cell, state, v.Drains)
		})
	return found
}

// drainThroughAPI changes cell to pool through the admin API while it
// holds domains, acting as the edge: it acknowledges every sequence and
// reports ready, checking that no sequence gives a domain fewer cells
// than its one replica and that the cell keeps its assignment until its
// domains serve elsewhere. It returns where the domains ended.
func drainThroughAPI(t *testing.T, e *env, c *controlclient.Client, id controlclient.Identity, cell, pool string, domains []string) map[string][]string {
	t.Helper()
	check := func(m manifest.Manifest) {
		t.Helper()
		got := cellsOf(m)
		for _, d := range domains {
			if len(got[d]) < 1 {
				t.Fatalf("sequence %d gives %s no cell: %v", m.Sequence, d, got)
			}
		}
	}
	a, err := e.admin.AssignCell(ctx(t), "a", cell, pool)
	if err != nil {
		t.Fatal(err)
	}
	if a.Drain == nil || a.Drain.State != "waiting" || !slices.Equal(a.Drain.Domains, domains) {
		t.Fatalf("changing %s with domains: %+v, drain %+v", cell, a, a.Drain)
	}
	m := collect(t, c, id)
	check(m)
	if m.Sequence != a.Sequence || m.Assignments.Cells[cell] != "reserved-eu" {
		t.Fatalf("sequence %d (answered %d) assigns %s to %q before its domains moved", m.Sequence, a.Sequence, cell, m.Assignments.Cells[cell])
	}
	for _, d := range domains {
		if got := cellsOf(m)[d]; len(got) != 2 || !slices.Contains(got, cell) {
			t.Fatalf("while %s drains %s is on %v: want it and its new cell", cell, d, got)
		}
	}
	// Applied but the new cells not ready (the draining cell still is):
	// edge show says what it waits for, routing stays on the cell.
	report := []string{"cell-01"}
	for _, other := range []string{"cell-03", "cell-04", "cell-05"} {
		if other != cell {
			other += "!"
		}
		report = append(report, other)
	}
	applyAndReport(t, c, m.Sequence, report...)
	v, err := e.admin.Edge(ctx(t), id.EdgeID)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(v.Drains, func(d adminapi.DrainView) bool { return d.Cell == cell })
	if i < 0 || v.Drains[i].State != "waiting" || !strings.Contains(v.Drains[i].WaitingFor, "ready") {
		t.Fatalf("edge show during the drain of %s: %+v", cell, v.Drains)
	}
	for _, d := range domains {
		if got := routes(t, e, d); len(got) != 1 || !strings.HasPrefix(got[0], cell+"@") {
			t.Fatalf("routing of %s while the new cells are not ready: %v", d, got)
		}
	}
	applyAndReport(t, c, m.Sequence, "cell-01", "cell-03", "cell-04", "cell-05")
	done := awaitDrain(t, e, id.EdgeID, cell, "done")
	m = collect(t, c, id)
	check(m)
	if got := m.Assignments.Cells[cell]; got != pool {
		t.Fatalf("after the drain %s is assigned to %q, want %q", cell, got, pool)
	}
	for _, d := range domains {
		if got := cellsOf(m)[d]; len(got) != 1 || got[0] == cell {
			t.Fatalf("after the drain %s is on %v", d, got)
		}
		if got := routes(t, e, d); len(got) != 1 || strings.HasPrefix(got[0], cell+"@") {
			t.Fatalf("routing of %s after the drain: %v", d, got)
		}
	}
	var steps []string
	for _, st := range done.Steps {
		steps = append(steps, st.Step)
	}
	if want := []string{"started", "placed", "delivering", "applied", "switched", "drained"}; !slices.Equal(steps, want) {
		t.Errorf("steps %v, want %v", steps, want)
	}
	applyAndReport(t, c, m.Sequence, "cell-01", "cell-03", "cell-04", "cell-05")
	return cellsOf(m)
}

func TestUnassignAndReassignCellThroughTheAPIs(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e = serveOn(t, e.dsn, e.sealKey, func(o *controlapi.Options) { o.MoveTick = 50 * time.Millisecond; o.MoveReadyWithin = time.Minute })
		a := e.createEdge(t, "a")
		c, id, _ := e.enroll(t, a.Token)
		drain := "200ms"
		if _, err := e.admin.CreatePoolWith(ctx(t), adminapi.PoolRequest{Name: "reserved-eu", Drain: &drain}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.admin.CreatePoolWith(ctx(t), adminapi.PoolRequest{Name: "reserved-us"}); err != nil {
			t.Fatal(err)
		}
		for _, cell := range []string{"cell-03", "cell-04"} {
			if _, err := e.admin.AssignCell(ctx(t), "a", cell, "reserved-eu"); err != nil {
				t.Fatal(err)
			}
		}
		applyAndReport(t, c, collect(t, c, id).Sequence, "cell-01", "cell-03", "cell-04")
		var all []string
		for i := range 6 {
			d := fmt.Sprintf("d%d.example.test", i)
			publishTo(t, e, d, "reserved-eu")
			all = append(all, d)
		}
		m := collect(t, c, id)
		applyAndReport(t, c, m.Sequence, "cell-01", "cell-03", "cell-04")
		on := map[string][]string{}
		for d, cells := range cellsOf(m) {
			on[cells[0]] = append(on[cells[0]], d)
		}
		cell, other := "cell-03", "cell-04"
		if len(on[cell]) == 0 {
			cell, other = other, cell
		}
		slices.Sort(on[cell])

		// Unassign: the cell's domains end on the pool's other cell.
		end := drainThroughAPI(t, e, c, id, cell, "", on[cell])
		for _, d := range all {
			if !slices.Equal(end[d], []string{other}) {
				t.Errorf("after unassigning %s, %s is on %v", cell, d, end[d])
			}
		}
		// Assigning the now empty cell is immediate (200, no drain).
		if a, err := e.admin.AssignCell(ctx(t), "a", cell, "reserved-eu"); err != nil || a.Drain != nil {
			t.Fatalf("assign an empty cell: %+v, %v", a, err)
		}
		m = collect(t, c, id)
		applyAndReport(t, c, m.Sequence, "cell-01", "cell-03", "cell-04")

		// Reassign the other cell, holding every domain, to another pool:
		// they all end on the first cell.
		end = drainThroughAPI(t, e, c, id, other, "reserved-us", all)
		for _, d := range all {
			if !slices.Equal(end[d], []string{cell}) {
				t.Errorf("after reassigning %s, %s is on %v", other, d, end[d])
			}
		}
	})
}

func TestUnassignRefusedAtTheBoundThroughTheAPIs(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		a := e.createEdge(t, "a")
		c, id, _ := e.enroll(t, a.Token)
		one, zero := 1, 0
		if _, err := e.admin.CreatePoolWith(ctx(t), adminapi.PoolRequest{Name: "reserved-small", Bound: &one, MinReady: &zero}); err != nil {
			t.Fatal(err)
		}
		for _, cell := range []string{"cell-03", "cell-04"} {
			if _, err := e.admin.AssignCell(ctx(t), "a", cell, "reserved-small"); err != nil {
				t.Fatal(err)
			}
		}
		publishTo(t, e, "one.example.test", "reserved-small")
		publishTo(t, e, "two.example.test", "reserved-small")
		before := collect(t, c, id)
		cell := cellsOf(before)["one.example.test"][0]
		_, err := e.admin.AssignCell(ctx(t), "a", cell, "")
		var ae *adminapi.Error
		if !errors.As(err, &ae) || ae.Status != http.StatusConflict || !strings.Contains(ae.Message, "one.example.test") || !strings.Contains(ae.Message, "at most 1 domain(s) a cell") {
			t.Fatalf("unassign with the other cell at its bound: %v", err)
		}
		after := collect(t, c, id)
		if after.Sequence != before.Sequence || after.Assignments.Cells[cell] != "reserved-small" {
			t.Fatalf("a refused unassignment changed the manifest: %d → %d, %v", before.Sequence, after.Sequence, after.Assignments.Cells)
		}
		if v, err := e.admin.Edge(ctx(t), id.EdgeID); err != nil || len(v.Drains) != 0 {
			t.Fatalf("a refused unassignment left a drain: %+v, %v", v.Drains, err)
		}
	})
}
