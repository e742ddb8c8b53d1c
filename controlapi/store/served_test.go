package store

import (
	"slices"
	"testing"
)

func TestServedRevision(t *testing.T) {
	spans := []Span{
		{EdgeID: "a", From: 2, To: 5, Revision: 1, Cells: []string{"cell-01"}},
		{EdgeID: "a", From: 5, To: 7, Revision: 2, Cells: []string{"cell-01", "cell-03"}},
		{EdgeID: "a", From: 9, Revision: 3, Cells: []string{"cell-03"}},
		{EdgeID: "b", From: 4, Revision: 2},
	}
	for _, tc := range []struct {
		name       string
		edge, cell string
		seq        int64
		want       int64
	}{
		{"nothing confirmed", "a", "cell-01", 0, 0},
		{"before the first entry", "a", "cell-01", 1, 0},
		{"first sequence of an entry", "a", "cell-01", 2, 1},
		{"last sequence of an entry", "a", "cell-01", 4, 1},
		{"next entry from its first sequence", "a", "cell-01", 5, 2},
		{"between a delete and a new entry", "a", "cell-01", 7, 0},
		{"entry naming other cells", "a", "cell-01", 9, 0},
		{"current entry", "a", "cell-03", 9, 3},
		{"current entry, a later sequence", "a", "cell-03", 40, 3},
		{"another edge's entry", "c", "cell-01", 5, 0},
		{"entry naming no cells", "b", "cell-07", 4, 2},
	} {
		if got := ServedRevision(spans, tc.edge, tc.cell, tc.seq); got != tc.want {
			t.Errorf("%s: %s of %s at sequence %d serves revision %d, want %d", tc.name, tc.cell, tc.edge, tc.seq, got, tc.want)
		}
	}
}

func TestDomainSpansFollowPublishesAndPruning(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		e := newEdge(t, s, "a")
		first := e.Sequence
		for i := range 2 {
			if _, err := s.PublishDomain(ctx(t), "x.example", "shared-default", nil, bytes([]byte{byte(i)})); err != nil {
				t.Fatal(err)
			}
			mustEdge(t, s, e.ID)
		}
		spans, err := s.DomainSpans(ctx(t), "x.example")
		if err != nil {
			t.Fatal(err)
		}
		want := []Span{
			{EdgeID: e.ID, From: first + 1, To: first + 2, Revision: 1, Cells: []string{"cell-01"}},
			{EdgeID: e.ID, From: first + 2, Revision: 2, Cells: []string{"cell-01"}},
		}
		if !slices.EqualFunc(spans, want, spanEqual) {
			t.Fatalf("spans %+v, want %+v", spans, want)
		}
		for seq, rev := range map[int64]int64{first: 0, first + 1: 1, first + 2: 2} {
			if got := ServedRevision(spans, e.ID, "cell-01", seq); got != rev {
				t.Errorf("sequence %d serves revision %d, want %d", seq, got, rev)
			}
		}

		// Another domain's publishes advance the edge past what it keeps:
		// the closed entry is pruned, and its sequence serves nothing known.
		for i := range keepSequences {
			if _, err := s.PublishDomain(ctx(t), "y.example", "shared-default", nil, bytes([]byte{byte(100 + i)})); err != nil {
				t.Fatal(err)
			}
			mustEdge(t, s, e.ID)
		}
		if spans, err = s.DomainSpans(ctx(t), "x.example"); err != nil {
			t.Fatal(err)
		}
		if !slices.EqualFunc(spans, want[1:], spanEqual) {
			t.Fatalf("spans after pruning %+v, want %+v", spans, want[1:])
		}
		if got := ServedRevision(spans, e.ID, "cell-01", first+1); got != 0 {
			t.Errorf("pruned sequence %d serves revision %d, want 0 (unknown)", first+1, got)
		}
		if got := ServedRevision(spans, e.ID, "cell-01", first+2); got != 2 {
			t.Errorf("sequence %d serves revision %d, want 2", first+2, got)
		}
	})
}

func spanEqual(a, b Span) bool {
	return a.EdgeID == b.EdgeID && a.From == b.From && a.To == b.To && a.Revision == b.Revision && slices.Equal(a.Cells, b.Cells)
}
