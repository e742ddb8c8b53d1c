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

// DomainApplied says what the cells that serve a domain (its active and
// target cells, on every edge) still wait for before they serve revision
// rev of it or a later one (empty: nothing), or why one of them cannot (an
// edge refused the manifest sequence that carries it). The ACME issuer
// waits on it before it has the CA validate challenges that revision
// carries.
func (s *Store) DomainApplied(ctx context.Context, domain string, rev int64) (waiting, refused string, err error) {
	ps, err := s.placements(ctx, s.db, domain)
	if err != nil {
		return "", "", err
	}
	from := map[string]int64{} // edge → the sequence its entry of rev starts at
	for _, p := range ps {
		if p.Role != RoleActive && p.Role != RoleTarget {
			continue
		}
		seq, seen := from[p.EdgeID]
		if !seen {
			var w, r string
			seq, w, r, err = s.edgeApplied(ctx, p.EdgeID, domain, rev)
			if err != nil || w != "" || r != "" {
				return w, r, err
			}
			from[p.EdgeID] = seq
		}
		var cells string
		err := s.db.QueryRowContext(ctx, s.q(`SELECT cells FROM acks WHERE edge_id = ? AND sequence >= ? AND status = ? ORDER BY sequence DESC LIMIT 1`),
			p.EdgeID, seq, manifest.AckPartial).Scan(&cells)
		if err == nil && slices.Contains(strings.Split(cells, ","), p.Cell) {
			return fmt.Sprintf("%s of edge %s to load sequence %d", p.Cell, p.EdgeID, seq), "", nil
		}
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return "", "", err
		}
	}
	return "", "", nil
}

// edgeApplied reads the edge's entry of the domain: the sequence it starts
// at once it carries revision rev or later, what the edge still waits for,
// or its refusal.
func (s *Store) edgeApplied(ctx context.Context, edgeID, domain string, rev int64) (seq int64, waiting, refused string, err error) {
	var have int64
	err = s.db.QueryRowContext(ctx, s.q(`SELECT from_seq, revision FROM manifest_entries WHERE edge_id = ? AND domain = ? AND to_seq = 0`),
		edgeID, domain).Scan(&seq, &have)
	if errors.Is(err, sql.ErrNoRows) || (err == nil && have < rev) {
		return 0, fmt.Sprintf("edge %s to poll for revision %d", edgeID, rev), "", nil
	}
	if err != nil {
		return 0, "", "", err
	}
	var at int64
	var reason string
	err = s.db.QueryRowContext(ctx, s.q(`SELECT sequence, reason FROM acks WHERE edge_id = ? AND sequence >= ? AND status = ? ORDER BY sequence LIMIT 1`),
		edgeID, seq, manifest.AckRefused).Scan(&at, &reason)
	if err == nil {
		return 0, "", fmt.Sprintf("edge %s refused manifest sequence %d: %s", edgeID, at, reason), nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return 0, "", "", err
	}
	var active int64
	if err := s.db.QueryRowContext(ctx, s.q(`SELECT active_sequence FROM edges WHERE id = ?`), edgeID).Scan(&active); err != nil {
		return 0, "", "", err
	}
	if active < seq {
		return 0, fmt.Sprintf("edge %s to apply sequence %d", edgeID, seq), "", nil
	}
	return seq, "", "", nil
}

// SwapSetting replaces a setting's value with next if it is still old, and
// reports whether it did: a compare-and-swap for a value that several
// replicas update (the ACME scheduler's lease).
func (s *Store) SwapSetting(ctx context.Context, name, old, next string) (bool, error) {
	n, err := s.exec(ctx, `UPDATE settings SET value = ? WHERE name = ? AND value = ?`, next, name, old)
	if err != nil {
		return false, fmt.Errorf("setting %s: %w", name, err)
	}
	return n == 1, nil
}
