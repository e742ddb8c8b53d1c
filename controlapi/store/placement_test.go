package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"cellvisor/controlapi/adminapi"
	"cellvisor/manifest"
	"cellvisor/testkit/testutil"
)

func assign(t *testing.T, s *Store, edge, cell, pool string) {
	t.Helper()
	if _, err := s.AssignCell(ctx(t), edge, cell, pool, fakeSign); err != nil {
		t.Fatal(err)
	}
}

func reserved(t *testing.T, s *Store, name string, replicas, bound int) Pool {
	t.Helper()
	p := DefaultPool(name, "reserved")
	p.Replicas, p.Bound, p.Drain = replicas, bound, 0
	p, err := s.CreatePool(ctx(t), p)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// cellsOn returns the cells domain's current entry names on an edge.
func cellsOn(t *testing.T, s *Store, edge, domain string) []string {
	t.Helper()
	return entryOn(t, s, edge, domain).Cells
}

// entryOn is the signed entry of domain in edge's latest manifest (zero
// when none), as its next poll would build it, with its artifact checked
// to be the one it names.
func entryOn(t *testing.T, s *Store, edge, domain string) manifest.Entry {
	t.Helper()
	e := mustEdge(t, s, edge)
	es, err := s.Entries(ctx(t), edge, e.Sequence, "", 500)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range es {
		if x.Domain == domain {
			if !signedFor(edge, x) {
				t.Fatalf("entry %+v is not signed for %s", x, edge)
			}
			return x
		}
	}
	return manifest.Entry{}
}

// artifactOf is the artifact an entry names, as the edge downloads it.
func artifactOf(t *testing.T, s *Store, edge string, e manifest.Entry) string {
	t.Helper()
	data, err := s.Artifact(ctx(t), edge, e.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func TestPoolRulesAndDefaults(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		sh, err := s.Pool(ctx(t), "shared-default")
		if err != nil || sh.Replicas != 1 || sh.Bound != 5000 || sh.MinReady != 0 || sh.Drain != time.Minute || sh.MaxConns != 4096 || sh.Rate != 200 {
			t.Fatalf("shared-default %+v, %v", sh, err)
		}
		for _, tc := range []struct {
			name     string
			class    string
			replicas int
			ok       bool
		}{
			{"shared-two", "shared", 2, false},
			{"quarantine-two", "quarantine", 2, false},
			{"reserved-three", "reserved", 3, true},
			{"dedicated-four", "dedicated", 4, false},
			{"reserved-zero", "reserved", 0, false},
		} {
			p := DefaultPool(tc.name, tc.class)
			p.Replicas = tc.replicas
			_, err := s.CreatePool(ctx(t), p)
			if (err == nil) != tc.ok || (!tc.ok && !errors.Is(err, ErrInvalid)) {
				t.Errorf("%s with %d replicas: %v", tc.name, tc.replicas, err)
			}
		}
		a := newEdge(t, s, "a")
		assign(t, s, a.ID, "cell-03", "reserved-three")
		seq := mustEdge(t, s, a.ID).Sequence
		p, _ := s.Pool(ctx(t), "reserved-three")
		p.MaxConns = 10
		if _, edges, err := s.UpdatePool(ctx(t), p, fakeSign); err != nil || len(edges) != 1 || edges[0].Sequence != seq+1 {
			t.Fatalf("update limits: %+v, %v", edges, err)
		}
		_, _, assignments, err := s.HeaderAssignments(ctx(t), a.ID, seq+1)
		if err != nil || assignments.Pools["reserved-three"].MaxConns != 10 || assignments.Cells["cell-03"] != "reserved-three" || assignments.Validate() != nil {
			t.Fatalf("signed assignments %+v, %v", assignments, err)
		}
		p.Bound = 7 // not a cell limit: no edge changes
		if _, edges, err := s.UpdatePool(ctx(t), p, fakeSign); err != nil || len(edges) != 0 {
			t.Fatalf("update bound: %+v, %v", edges, err)
		}
		if err := s.DeletePool(ctx(t), "reserved-three"); !errors.Is(err, ErrConflict) {
			t.Fatalf("delete a pool with a cell: %v", err)
		}
		if _, err := s.AssignCell(ctx(t), a.ID, "cell-09", "reserved-three", fakeSign); !errors.Is(err, ErrInvalid) {
			t.Fatalf("assign cell-09 of 8: %v", err)
		}
		assign(t, s, a.ID, "cell-03", "")
		if err := s.DeletePool(ctx(t), "reserved-three"); err != nil {
			t.Fatalf("delete an empty pool: %v", err)
		}
	})
}

// mustEdge is an edge after its manifest is built past every fan-out, as
// its next poll builds it.
func mustEdge(t *testing.T, s *Store, id string) Edge {
	t.Helper()
	if _, err := s.Build(ctx(t), id, fakeSign); err != nil {
		t.Fatal(err)
	}
	e, err := s.Edge(ctx(t), id)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestPlacementIsDurableAndReplicated(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		a := newEdge(t, s, "a")
		reserved(t, s, "reserved-eu", 2, 0)
		for _, c := range []string{"cell-03", "cell-04", "cell-05"} {
			assign(t, s, a.ID, c, "reserved-eu")
		}
		before := map[string][]string{}
		for i := range 20 {
			d := fmt.Sprintf("d%02d.example", i)
			if _, err := s.PublishDomain(ctx(t), d, "reserved-eu", nil, bytes([]byte(d))); err != nil {
				t.Fatal(err)
			}
			cells := cellsOn(t, s, a.ID, d)
			if len(cells) != 2 || cells[0] == cells[1] || !slices.IsSorted(cells) {
				t.Fatalf("%s on %v, want 2 distinct sorted cells", d, cells)
			}
			before[d] = cells
		}
		// An unrelated cell and domain move nothing.
		assign(t, s, a.ID, "cell-06", "reserved-eu")
		if _, err := s.PublishDomain(ctx(t), "new.example", "reserved-eu", nil, bytes([]byte("n"))); err != nil {
			t.Fatal(err)
		}
		for d, cells := range before {
			if _, err := s.PublishDomain(ctx(t), d, "reserved-eu", nil, bytes([]byte(d+"2"))); err != nil {
				t.Fatal(err)
			}
			if got := cellsOn(t, s, a.ID, d); !slices.Equal(got, cells) {
				t.Errorf("%s moved from %v to %v", d, cells, got)
			}
		}
		// The default pools' domains stay on their one cell.
		if _, err := s.PublishDomain(ctx(t), "shared.example", "shared-default", nil, bytes([]byte("s"))); err != nil {
			t.Fatal(err)
		}
		if got := cellsOn(t, s, a.ID, "shared.example"); !slices.Equal(got, []string{"cell-01"}) {
			t.Errorf("shared domain on %v", got)
		}
		// A cell holding domains is not unassigned under them.
		if _, err := s.AssignCell(ctx(t), a.ID, "cell-03", "", fakeSign); !errors.Is(err, ErrConflict) {
			t.Errorf("unassign a cell with domains: %v", err)
		}
	})
}

func TestPlacementRefusals(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		a := newEdge(t, s, "a")
		reserved(t, s, "reserved-small", 1, 1)
		assign(t, s, a.ID, "cell-03", "reserved-small")
		if _, err := s.PublishDomain(ctx(t), "one.example", "reserved-small", nil, bytes([]byte("1"))); err != nil {
			t.Fatal(err)
		}
		_, err := s.PublishDomain(ctx(t), "two.example", "reserved-small", nil, bytes([]byte("2")))
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("past the bound: %v", err)
		}
		if _, err := s.Domain(ctx(t), "two.example"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("a refused publish left the domain: %v", err)
		}
		// Below the minimum of ready cells: new placements refused, the
		// placed domain keeps its revisions coming.
		sh, _ := s.Pool(ctx(t), "shared-default")
		sh.MinReady = 1
		if _, _, err := s.UpdatePool(ctx(t), sh, fakeSign); err != nil {
			t.Fatal(err)
		}
		status, _ := json.Marshal(map[string]any{"slots": []map[string]any{{"name": "cell-01", "pool": "shared-default", "state": "degraded"}}})
		if err := s.PutStatus(ctx(t), a.ID, Report{Status: status, At: time.Now()}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.PublishDomain(ctx(t), "new.example", "shared-default", nil, bytes([]byte("n"))); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("below the minimum: %v", err)
		}
		if _, err := s.PublishDomain(ctx(t), "one.example", "reserved-small", nil, bytes([]byte("1b"))); err != nil {
			t.Fatalf("a placed domain's next revision: %v", err)
		}
		// With another edge up, the publish goes there and names the one
		// skipped; once that one is ready, the next publish places it.
		b := newEdge(t, s, "b")
		p, err := s.PublishDomain(ctx(t), "new.example", "shared-default", nil, bytes([]byte("n")))
		if err != nil || p.Pending != 1 || len(cellsOn(t, s, b.ID, "new.example")) != 1 || p.Skipped[a.ID] == "" {
			t.Fatalf("one edge below its minimum: %+v, %v", p, err)
		}
		status, _ = json.Marshal(map[string]any{"slots": []map[string]any{{"name": "cell-01", "pool": "shared-default", "state": "ready"}}})
		if err := s.PutStatus(ctx(t), a.ID, Report{Status: status, At: time.Now()}); err != nil {
			t.Fatal(err)
		}
		if p, err := s.PublishDomain(ctx(t), "new.example", "shared-default", nil, bytes([]byte("n2"))); err != nil || p.Pending != 2 || len(p.Skipped) != 0 {
			t.Fatalf("after the edge recovered: %+v, %v", p, err)
		}
		if got := cellsOn(t, s, a.ID, "new.example"); !slices.Equal(got, []string{"cell-01"}) {
			t.Fatalf("placed on the recovered edge: %v", got)
		}
	})
}

// Two replicas (two Stores on one database) placing at once never give a
// domain more cells on an edge than its pool's replicas.
func TestConcurrentPlacement(t *testing.T) {
	t.Run(SQLite, func(t *testing.T) {
		dsn := filepath.Join(t.TempDir(), "control.db")
		concurrentPlacement(t, open(t, dsn), open(t, dsn))
	})
	t.Run(Postgres, func(t *testing.T) {
		dsn := testutil.Postgres(t)
		concurrentPlacement(t, open(t, dsn), open(t, dsn))
	})
}

func concurrentPlacement(t *testing.T, s, other *Store) {
	{
		a := newEdge(t, s, "a")
		reserved(t, s, "reserved-eu", 2, 0)
		for _, c := range []string{"cell-03", "cell-04", "cell-05", "cell-06"} {
			assign(t, s, a.ID, c, "reserved-eu")
		}
		var wg sync.WaitGroup
		errs := make(chan error, 40)
		for i := range 40 {
			st := s
			if i%2 == 1 {
				st = other
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := st.PublishDomain(ctx(t), fmt.Sprintf("c%d.example", i%10), "reserved-eu", nil, bytes([]byte{byte(i)}))
				if err != nil && !errors.Is(err, ErrConflict) {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		for i := range 10 {
			d := fmt.Sprintf("c%d.example", i)
			ps, err := s.Placements(ctx(t), d)
			if err != nil || len(ps) != 2 || ps[0].Cell == ps[1].Cell {
				t.Errorf("%s placed %+v, %v", d, ps, err)
			}
		}
	}
}

// report makes an edge say it applied its current sequence and every
// named cell is ready at it.
func report(t *testing.T, s *Store, edge string, cells ...string) int64 {
	t.Helper()
	seq := mustEdge(t, s, edge).Sequence
	if err := s.Ack(ctx(t), edge, manifest.Ack{Sequence: seq, Status: manifest.AckApplied, At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	var slots []map[string]any
	for i, c := range cells {
		slots = append(slots, map[string]any{"name": c, "pool": "x", "state": "ready", "sequence": seq, "http_port": 8000 + i})
	}
	status, _ := json.Marshal(map[string]any{"slots": slots})
	if err := s.PutStatus(ctx(t), edge, Report{Status: status, At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	return seq
}

// fakeRebuild marks the artifact with the pool and revision it is for.
func fakeRebuild(artifact []byte, pool string, rev int64) ([]byte, error) {
	return fmt.Appendf(artifact, "@%s/%d", pool, rev), nil
}

func TestMoveTargetFirst(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		a := newEdge(t, s, "a")
		reserved(t, s, "reserved-eu", 2, 0)
		assign(t, s, a.ID, "cell-03", "reserved-eu")
		assign(t, s, a.ID, "cell-04", "reserved-eu")
		if _, err := s.PublishDomain(ctx(t), "m.example", "shared-default", nil, bytes([]byte("1"))); err != nil {
			t.Fatal(err)
		}
		m, _, err := s.StartMove(ctx(t), "m.example", "reserved-eu", time.Hour, fakeSign)
		if err != nil || m.State != adminapi.MoveWaiting {
			t.Fatalf("start: %+v, %v", m, err)
		}
		if got := cellsOn(t, s, a.ID, "m.example"); !slices.Equal(got, []string{"cell-01", "cell-03", "cell-04"}) {
			t.Fatalf("during the move the entry names %v, want source and target cells", got)
		}
		// Not applied yet: it waits, the source stays active.
		if m, waiting, err := s.StepMove(ctx(t), "m.example", fakeSign, fakeRebuild); err != nil || m.State != adminapi.MoveWaiting || waiting == "" {
			t.Fatalf("before the ack: %+v, %q, %v", m, waiting, err)
		}
		// A revision published during the move goes to both sides.
		if _, err := s.PublishDomain(ctx(t), "m.example", "shared-default", nil, bytes([]byte("2"))); err != nil {
			t.Fatal(err)
		}
		if got := cellsOn(t, s, a.ID, "m.example"); len(got) != 3 {
			t.Fatalf("revision 2 went to %v", got)
		}
		report(t, s, a.ID, "cell-01", "cell-03") // cell-04 not ready
		if m, waiting, _ := s.StepMove(ctx(t), "m.example", fakeSign, fakeRebuild); m.State != adminapi.MoveWaiting || waiting == "" {
			t.Fatalf("one target not ready: %+v %q", m, waiting)
		}
		report(t, s, a.ID, "cell-01", "cell-03", "cell-04")
		m, _, err = s.StepMove(ctx(t), "m.example", fakeSign, fakeRebuild)
		if err != nil || m.State != adminapi.MoveDraining {
			t.Fatalf("switch: %+v, %v", m, err)
		}
		d, _ := s.Domain(ctx(t), "m.example")
		if d.Pool != "reserved-eu" {
			t.Fatalf("active pool after the switch: %s", d.Pool)
		}
		if got := cellsOn(t, s, a.ID, "m.example"); len(got) != 3 {
			t.Fatalf("the source let go before draining: %v", got)
		}
		// Until the move finishes, the entry names its artifact's pool.
		if e := entryOn(t, s, a.ID, "m.example"); e.Pool != "shared-default" || e.Revision != 2 || artifactOf(t, s, a.ID, e) != "2" {
			t.Fatalf("while draining the entry is %+v", e)
		}
		// shared-default drains for a minute: fast-forward the clock.
		s.Now = func() time.Time { return time.Now().Add(2 * time.Minute) }
		m, _, err = s.StepMove(ctx(t), "m.example", fakeSign, fakeRebuild)
		if err != nil || m.State != adminapi.MoveDone {
			t.Fatalf("finish: %+v, %v", m, err)
		}
		if got := cellsOn(t, s, a.ID, "m.example"); !slices.Equal(got, []string{"cell-03", "cell-04"}) {
			t.Fatalf("after the move the entry names %v", got)
		}
		// The current configuration was published again, built for the
		// target pool: entry and artifact agree on it.
		e := entryOn(t, s, a.ID, "m.example")
		if e.Pool != "reserved-eu" || e.Revision != 3 || e.Rollback || artifactOf(t, s, a.ID, e) != "2@reserved-eu/3" {
			t.Fatalf("after the move the entry is %+v, artifact %q", e, artifactOf(t, s, a.ID, e))
		}
		if d, _ := s.Domain(ctx(t), "m.example"); d.Pool != "reserved-eu" || d.Revision != 3 {
			t.Fatalf("after the move the domain is %+v", d)
		}
		var steps []string
		for _, st := range m.Steps {
			steps = append(steps, st.Step)
		}
		if want := []string{"started", "placed", "delivering", "applied", "switched", "drained"}; !slices.Equal(steps, want) {
			t.Errorf("steps %v, want %v", steps, want)
		}
	})
}

// A revision published while a move drains is the target pool's, and goes
// to the source and target cells; finishing the move then publishes
// nothing more.
func TestMovePublishWhileDraining(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		a := newEdge(t, s, "a")
		reserved(t, s, "reserved-eu", 1, 0)
		assign(t, s, a.ID, "cell-03", "reserved-eu")
		if _, err := s.PublishDomain(ctx(t), "d.example", "shared-default", nil, bytes([]byte("1"))); err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.StartMove(ctx(t), "d.example", "reserved-eu", time.Hour, fakeSign); err != nil {
			t.Fatal(err)
		}
		report(t, s, a.ID, "cell-01", "cell-03")
		if m, _, err := s.StepMove(ctx(t), "d.example", fakeSign, fakeRebuild); err != nil || m.State != adminapi.MoveDraining {
			t.Fatalf("switch: %+v, %v", m, err)
		}
		if _, err := s.PublishDomain(ctx(t), "d.example", "shared-default", nil, bytes([]byte("x"))); !errors.Is(err, ErrConflict) {
			t.Fatalf("publish to the source pool after the switch: %v, want a conflict", err)
		}
		if _, err := s.PublishDomain(ctx(t), "d.example", "reserved-eu", nil, bytes([]byte("2"))); err != nil {
			t.Fatal(err)
		}
		e := entryOn(t, s, a.ID, "d.example")
		if e.Pool != "reserved-eu" || e.Revision != 2 || !slices.Equal(e.Cells, []string{"cell-01", "cell-03"}) {
			t.Fatalf("revision published while draining: %+v", e)
		}
		s.Now = func() time.Time { return time.Now().Add(2 * time.Minute) }
		m, _, err := s.StepMove(ctx(t), "d.example", fakeSign, fakeRebuild)
		if err != nil || m.State != adminapi.MoveDone {
			t.Fatalf("finish: %+v, %v", m, err)
		}
		e = entryOn(t, s, a.ID, "d.example")
		if e.Pool != "reserved-eu" || e.Revision != 2 || artifactOf(t, s, a.ID, e) != "2" || !slices.Equal(e.Cells, []string{"cell-03"}) {
			t.Fatalf("after the move: %+v", e)
		}
	})
}

func TestMoveFailsOnRefusalAndTimeout(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		a := newEdge(t, s, "a")
		reserved(t, s, "reserved-eu", 1, 0)
		assign(t, s, a.ID, "cell-03", "reserved-eu")
		if _, err := s.PublishDomain(ctx(t), "f.example", "shared-default", nil, bytes([]byte("1"))); err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.StartMove(ctx(t), "f.example", "reserved-eu", time.Hour, fakeSign); err != nil {
			t.Fatal(err)
		}
		seq := mustEdge(t, s, a.ID).Sequence
		if err := s.Ack(ctx(t), a.ID, manifest.Ack{Sequence: seq, Status: manifest.AckRefused, Reason: "artifact invalid", At: time.Now()}); err != nil {
			t.Fatal(err)
		}
		m, _, err := s.StepMove(ctx(t), "f.example", fakeSign, fakeRebuild)
		if err != nil || m.State != adminapi.MoveFailed || m.Reason == "" {
			t.Fatalf("refused: %+v, %v", m, err)
		}
		d, _ := s.Domain(ctx(t), "f.example")
		if got := cellsOn(t, s, a.ID, "f.example"); d.Pool != "shared-default" || !slices.Equal(got, []string{"cell-01"}) {
			t.Fatalf("after a failed move: pool %s, cells %v", d.Pool, got)
		}
		// A target never ready fails at its deadline.
		if _, _, err := s.StartMove(ctx(t), "f.example", "reserved-eu", time.Second, fakeSign); err != nil {
			t.Fatal(err)
		}
		s.Now = func() time.Time { return time.Now().Add(time.Minute) }
		if m, _, err := s.StepMove(ctx(t), "f.example", fakeSign, fakeRebuild); err != nil || m.State != adminapi.MoveFailed {
			t.Fatalf("timeout: %+v, %v", m, err)
		}
		// Cancel before the switch.
		s.Now = time.Now
		if _, _, err := s.StartMove(ctx(t), "f.example", "reserved-eu", time.Hour, fakeSign); err != nil {
			t.Fatal(err)
		}
		if m, err := s.CancelMove(ctx(t), "f.example", fakeSign); err != nil || m.State != adminapi.MoveCancelled {
			t.Fatalf("cancel: %+v, %v", m, err)
		}
		if got := cellsOn(t, s, a.ID, "f.example"); !slices.Equal(got, []string{"cell-01"}) {
			t.Fatalf("after cancel: %v", got)
		}
	})
}
