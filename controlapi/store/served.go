package store

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// Span is one manifest entry of a domain on an edge: the revision that the
// edge's sequences From up to, not including, To (0: still current) carry
// for Cells (none named: every cell of the entry's pool, as written before
// entries named their cells).
type Span struct {
	EdgeID   string
	From     int64
	To       int64
	Revision int64
	Cells    []string
}

// covers reports whether the span is in sequence seq of its edge.
func (sp Span) covers(seq int64) bool {
	return sp.From <= seq && (sp.To == 0 || seq < sp.To)
}

// DomainSpans returns a domain's manifest entries on the edges where it is
// placed, by edge and sequence. It is bounded by the placements: an edge
// keeps the entries of its last keepSequences sequences and a domain has
// at most one entry per sequence, so an edge has at most keepSequences+1
// rows of a domain. Older sequences have no rows left (pruned).
func (s *Store) DomainSpans(ctx context.Context, domain string) ([]Span, error) {
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT edge_id, from_seq, to_seq, revision, cells FROM manifest_entries
		WHERE domain = ? AND edge_id IN (SELECT edge_id FROM placements WHERE domain = ?) ORDER BY edge_id, from_seq`), domain, domain)
	if err != nil {
		return nil, fmt.Errorf("manifest entries of %s: %w", domain, err)
	}
	defer rows.Close()
	var out []Span
	for rows.Next() {
		var sp Span
		var cells string
		if err := rows.Scan(&sp.EdgeID, &sp.From, &sp.To, &sp.Revision, &cells); err != nil {
			return nil, fmt.Errorf("manifest entries of %s: %w", domain, err)
		}
		if cells != "" {
			sp.Cells = strings.Split(cells, ",")
		}
		out = append(out, sp)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("manifest entries of %s: %w", domain, err)
	}
	return out, nil
}

// ServedRevision is the revision of a domain that a cell of an edge serves
// once it confirmed the edge's manifest sequence seq, given the domain's
// spans (DomainSpans): 0 when it serves none. That is when seq does not
// carry the domain (before its first entry, after its delete), when the
// entry names other cells, when seq is 0 (the cell confirmed nothing), and
// when seq is so old its entries were pruned: unknown, so not applied.
func ServedRevision(spans []Span, edgeID, cell string, seq int64) int64 {
	if seq < 1 {
		return 0
	}
	for _, sp := range spans {
		if sp.EdgeID != edgeID || !sp.covers(seq) {
			continue
		}
		if len(sp.Cells) > 0 && !slices.Contains(sp.Cells, cell) {
			return 0
		}
		return sp.Revision
	}
	return 0
}
