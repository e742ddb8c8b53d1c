package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"

	"cellvisor/manifest"
)

// Fanout is a publish, rollback or delete of a domain that the edges with
// a cell in one of its pools build into their manifests when they next
// poll (Build). Gen is the generation of the transaction that wrote it.
type Fanout struct {
	Gen    int64
	Domain string
	Pools  []string
}

// Concerns reports whether the fan-out may change the manifest of an edge
// with cells in pools.
func (f Fanout) Concerns(pools []string) bool {
	for _, p := range f.Pools {
		if slices.Contains(pools, p) {
			return true
		}
	}
	return false
}

// fanOut records that domain changed for every edge with a cell in pool or
// in a pool where the domain is placed (both sides of a move), and counts
// the edges where it is placed into out: a constant number of rows written,
// whatever the fleet's size. Fan-outs every edge is built past are removed.
func (s *Store) fanOut(ctx context.Context, tx *sql.Tx, gen int64, domain, pool string, out *Published) error {
	pools, err := s.strings(ctx, tx, `SELECT DISTINCT pool FROM placements WHERE domain = ?`, domain)
	if err != nil {
		return fmt.Errorf("fan out %s: %w", domain, err)
	}
	if pool != "" && !slices.Contains(pools, pool) {
		pools = append(pools, pool)
	}
	slices.Sort(pools)
	if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO fanouts (gen, domain, pools, created_at) VALUES (?, ?, ?, ?)`),
		gen, domain, strings.Join(pools, ","), ms(s.Now())); err != nil {
		return fmt.Errorf("fan out %s: %w", domain, err)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM fanouts WHERE gen <= (SELECT COALESCE(MIN(built), 0) FROM edges)`); err != nil {
		return fmt.Errorf("prune fan-outs: %w", err)
	}
	out.Fanout = gen
	if err := tx.QueryRowContext(ctx, s.q(`SELECT COUNT(DISTINCT edge_id) FROM placements WHERE domain = ?`), domain).Scan(&out.Pending); err != nil {
		return fmt.Errorf("fan out %s: %w", domain, err)
	}
	return nil
}

// Fanouts returns the fan-outs above generation since and at most upto,
// oldest first.
func (s *Store) Fanouts(ctx context.Context, since, upto int64) ([]Fanout, error) {
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT gen, domain, pools FROM fanouts WHERE gen > ? AND gen <= ? ORDER BY gen`), since, upto)
	if err != nil {
		return nil, fmt.Errorf("fan-outs: %w", err)
	}
	defer rows.Close()
	var out []Fanout
	for rows.Next() {
		var f Fanout
		var pools string
		if err := rows.Scan(&f.Gen, &f.Domain, &pools); err != nil {
			return nil, fmt.Errorf("fan-outs: %w", err)
		}
		if pools != "" {
			f.Pools = strings.Split(pools, ",")
		}
		out = append(out, f)
	}
	return out, rows.Err()
}

// Built is an edge's manifest after Build: its newest sequence, whether
// Build advanced it, and the generation it is now built to.
type Built struct {
	Sequence int64
	Advanced bool
	Gen      int64
}

// Build brings an edge's manifest up to every fan-out committed: each
// fanned-out domain's entry made as it should be now (entryFor), and only
// when one differs from the edge's does the edge get a new sequence, one
// above its last however many fan-outs it missed, with those entries and
// its header signed for it. ErrNotFound for an unknown edge.
func (s *Store) Build(ctx context.Context, edgeID string, sign Signer) (Built, error) {
	var out Built
	err := s.tx(ctx, func(tx *sql.Tx) error {
		// The generation counter first, as every publish takes it: every
		// fan-out below it has committed, none above it can be seen.
		gen, err := s.next(ctx, tx, "gen")
		if err != nil {
			return err
		}
		lock := ""
		if s.dialect == Postgres {
			lock = " FOR UPDATE"
		}
		var built int64
		err = tx.QueryRowContext(ctx, s.q(`SELECT built, sequence FROM edges WHERE id = ?`+lock), edgeID).Scan(&built, &out.Sequence)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("edge %s: %w", edgeID, ErrNotFound)
		}
		if err != nil {
			return err
		}
		domains, err := s.strings(ctx, tx, `SELECT DISTINCT domain FROM fanouts WHERE gen > ? ORDER BY domain`, built)
		if err != nil {
			return err
		}
		var changed []string
		for _, d := range domains {
			diff, err := s.entryChanged(ctx, tx, edgeID, d)
			if err != nil {
				return err
			}
			if diff {
				changed = append(changed, d)
			}
		}
		out.Gen = gen
		if len(changed) == 0 {
			_, err := tx.ExecContext(ctx, s.q(`UPDATE edges SET built = ?, gen = ? WHERE id = ?`), gen, gen, edgeID)
			return err
		}
		es, err := s.reemitEdge(ctx, tx, gen, edgeID, changed, sign)
		if err != nil {
			return err
		}
		out.Sequence, out.Advanced = es.Sequence, true
		_, err = tx.ExecContext(ctx, s.q(`UPDATE edges SET built = ? WHERE id = ?`), gen, edgeID)
		return err
	})
	if err != nil {
		return Built{}, fmt.Errorf("build the manifest of edge %s: %w", edgeID, err)
	}
	return out, nil
}

// entryChanged reports whether domain's entry on an edge, as it should be
// now, differs from the one in the edge's current manifest (or one of them
// is missing).
func (s *Store) entryChanged(ctx context.Context, tx *sql.Tx, edgeID, domain string) (bool, error) {
	want, ok, err := s.entryWith(ctx, tx, domain, edgeID, false)
	if err != nil {
		return false, err
	}
	cur, err := scanEntry(tx.QueryRowContext(ctx, s.q(`SELECT `+entryColumns+` FROM manifest_entries
		WHERE edge_id = ? AND domain = ? AND to_seq = 0`), edgeID, domain))
	has := err == nil
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return false, fmt.Errorf("entry %s of edge %s: %w", domain, edgeID, err)
	}
	if !ok || !has {
		return ok != has, nil
	}
	return !sameEntry(cur, want), nil
}

// sameEntry compares what two entries say, their signatures aside, and
// their keys by the encryption key they are sealed to (each seal is
// random; the artifact's digest covers the certificate).
func sameEntry(a, b manifest.Entry) bool {
	return a.Domain == b.Domain && a.Pool == b.Pool && a.Revision == b.Revision && a.Size == b.Size &&
		a.SHA256 == b.SHA256 && a.Rollback == b.Rollback && slices.Equal(a.Cells, b.Cells) && keyID(a.Key) == keyID(b.Key)
}

func keyID(k *manifest.SealedKey) string {
	if k == nil {
		return ""
	}
	return k.KeyID
}
