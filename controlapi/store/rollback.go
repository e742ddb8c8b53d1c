package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// Revision returns revision rev of a domain as it was published, with its
// artifact's bytes, or ErrNotFound.
func (s *Store) Revision(ctx context.Context, domain string, rev int64) (Domain, []byte, error) {
	d := Domain{Name: domain, Revision: rev}
	var at int64
	var data []byte
	err := s.db.QueryRowContext(ctx, s.q(`SELECT r.pool, r.sha256, r.size, r.created_at, a.data FROM domain_revisions r
		JOIN artifacts a ON a.sha256 = r.sha256 WHERE r.domain = ? AND r.revision = ?`), domain, rev).Scan(&d.Pool, &d.SHA256, &d.Size, &at, &data)
	if errors.Is(err, sql.ErrNoRows) {
		return Domain{}, nil, fmt.Errorf("domain %s revision %d: %w", domain, rev, ErrNotFound)
	}
	d.UpdatedAt = fromMS(at)
	return d, data, err
}

// RollbackDomain makes revision rev of domain, lower than its current one,
// current again: its artifact republished to every edge of its pool (and
// withdrawn from the pool the domain leaves, if it moved since), each
// entry marked as a signed rollback so that the edges take the lower
// revision. hostnames are the old revision's. The next publish still gets
// a revision above every one the domain had.
func (s *Store) RollbackDomain(ctx context.Context, domain string, rev int64, hostnames []string) (Published, error) {
	var out Published
	err := s.tx(ctx, func(tx *sql.Tx) error {
		gen, err := s.next(ctx, tx, "gen") // first: see PublishDomain
		if err != nil {
			return err
		}
		cur, err := s.domain(ctx, tx, domain, true)
		if err != nil {
			return err
		}
		if rev >= cur.Revision && !cur.Deleted {
			return fmt.Errorf("revision %d is not below the current %d: %w", rev, cur.Revision, ErrConflict)
		}
		var old Domain
		err = tx.QueryRowContext(ctx, s.q(`SELECT pool, sha256, size FROM domain_revisions WHERE domain = ? AND revision = ?`), domain, rev).
			Scan(&old.Pool, &old.SHA256, &old.Size)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("revision %d: %w", rev, ErrNotFound)
		}
		if err != nil {
			return err
		}
		if !cur.Deleted && old.Pool != cur.Pool {
			return fmt.Errorf("revision %d is pool %s's, the domain is in %s: move it back first: %w", rev, old.Pool, cur.Pool, ErrConflict)
		}
		p, err := s.pool(ctx, tx, old.Pool)
		if err != nil {
			return err
		}
		if err := s.claim(ctx, tx, domain, hostnames); err != nil {
			return err
		}
		d := Domain{Name: domain, Pool: old.Pool, Revision: rev, SHA256: old.SHA256, Size: old.Size, UpdatedAt: fromMS(ms(s.Now()))}
		if _, err := tx.ExecContext(ctx, s.q(`UPDATE domains SET pool = ?, revision = ?, sha256 = ?, size = ?, deleted = 0, updated_at = ? WHERE name = ?`),
			d.Pool, d.Revision, d.SHA256, d.Size, ms(d.UpdatedAt), domain); err != nil {
			return fmt.Errorf("store domain: %w", err)
		}
		out.Domain = d
		// The entries are marked rollback: the revision is below the top.
		return s.placeAndFanOut(ctx, tx, gen, domain, p, &out)
	})
	if err != nil {
		return Published{}, fmt.Errorf("roll %s back to revision %d: %w", domain, rev, err)
	}
	return out, nil
}
