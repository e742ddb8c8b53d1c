package store

import (
	"fmt"
	"sync"
	"testing"
)

// rows counts the rows of the tables a publish could write per edge.
func rows(t *testing.T, s *Store) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for name, q := range map[string]string{
		"entries":   `SELECT COUNT(*) FROM manifest_entries`,
		"closed":    `SELECT COUNT(*) FROM manifest_entries WHERE to_seq <> 0`,
		"headers":   `SELECT COUNT(*) FROM manifest_headers`,
		"sequences": `SELECT COALESCE(SUM(sequence), 0) FROM edges`,
		"fanouts":   `SELECT COUNT(*) FROM fanouts`,
	} {
		var n int64
		if err := s.db.QueryRowContext(ctx(t), q).Scan(&n); err != nil {
			t.Fatal(err)
		}
		out[name] = n
	}
	return out
}

// A revision published to a pool of many edges writes the same rows as to
// one: nothing per edge until each edge's poll builds its manifest, which
// gives it one new sequence for any number of publishes.
func TestPublishFansOutInConstantRows(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		var ids []string
		for i := range 12 {
			ids = append(ids, newEdge(t, s, fmt.Sprintf("e%02d", i)).ID)
		}
		other, err := s.CreateEdge(ctx(t), NewEdge{ID: "id-q", Name: "q", Slots: 1, TokenHash: "tok-q",
			Assignments: map[string]string{"cell-01": "quarantine-default"}}, fakeSign)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.PublishDomain(ctx(t), "x.example", "shared-default", nil, bytes([]byte("v1"))); err != nil {
			t.Fatal(err)
		}
		for _, id := range ids {
			mustEdge(t, s, id)
		}
		before := rows(t, s)
		for i := range 3 {
			p, err := s.PublishDomain(ctx(t), "x.example", "shared-default", nil, bytes([]byte(fmt.Sprintf("v%d", i+2))))
			if err != nil || p.Pending != len(ids) || len(p.Edges) != 0 {
				t.Fatalf("publish: %+v, %v", p, err)
			}
		}
		after := rows(t, s)
		for _, k := range []string{"entries", "closed", "headers", "sequences"} {
			if after[k] != before[k] {
				t.Errorf("%s: %d before three publishes, %d after; want no row per edge", k, before[k], after[k])
			}
		}
		// The edge outside the pool never built past the first: all four
		// kept.
		if after["fanouts"] != 4 {
			t.Errorf("fan-outs %d, want 4", after["fanouts"])
		}
		for _, id := range ids {
			b, err := s.Build(ctx(t), id, fakeSign)
			if err != nil || !b.Advanced || b.Sequence != 3 {
				t.Fatalf("build %s: %+v, %v; want sequence 3 (1 first, 2 revision 1)", id, b, err)
			}
			if e := entryOn(t, s, id, "x.example"); e.Revision != 4 {
				t.Fatalf("edge %s has revision %d, want 4", id, e.Revision)
			}
			// Built again: nothing newer, the same sequence.
			if b, err := s.Build(ctx(t), id, fakeSign); err != nil || b.Advanced || b.Sequence != 3 {
				t.Fatalf("build %s again: %+v, %v", id, b, err)
			}
		}
		// The edge outside the pool builds nothing.
		if b, err := s.Build(ctx(t), other.ID, fakeSign); err != nil || b.Advanced || b.Sequence != 1 {
			t.Fatalf("build of an edge outside the pool: %+v, %v", b, err)
		}
		// Every edge built past them: the next fan-out prunes them.
		if _, err := s.PublishDomain(ctx(t), "y.example", "quarantine-default", nil, bytes([]byte("y"))); err != nil {
			t.Fatal(err)
		}
		if got := rows(t, s)["fanouts"]; got != 1 {
			t.Errorf("fan-outs after every edge built: %d, want only the newest", got)
		}
		if _, err := s.Build(ctx(t), "nope", fakeSign); err == nil {
			t.Fatal("build of an unknown edge: no error")
		}
	})
}

// Builds racing publishes and each other: an edge's sequence only grows,
// every build sees a signed header, and the last build holds every
// domain's newest revision.
func TestBuildsRacingPublishes(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		e := newEdge(t, s, "a")
		const domains, revisions = 3, 4
		var wg sync.WaitGroup
		errs := make(chan error, domains*revisions+4*8)
		for d := range domains {
			wg.Go(func() {
				for r := range revisions {
					name := fmt.Sprintf("d%d.example", d)
					if _, err := s.PublishDomain(ctx(t), name, "shared-default", nil, bytes([]byte(fmt.Sprintf("%s-%d", name, r)))); err != nil {
						errs <- err
					}
				}
			})
		}
		for range 4 {
			wg.Go(func() {
				last := int64(0)
				for range 8 {
					b, err := s.Build(ctx(t), e.ID, fakeSign)
					if err != nil {
						errs <- err
						return
					}
					if b.Sequence < last {
						errs <- fmt.Errorf("sequence went back %d → %d", last, b.Sequence)
					}
					last = b.Sequence
					if _, _, err := s.Header(ctx(t), e.ID, b.Sequence); err != nil {
						errs <- fmt.Errorf("header of sequence %d: %w", b.Sequence, err)
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		for d := range domains {
			if got := entryOn(t, s, e.ID, fmt.Sprintf("d%d.example", d)); got.Revision != revisions {
				t.Errorf("d%d.example at revision %d, want %d", d, got.Revision, revisions)
			}
		}
	})
}
