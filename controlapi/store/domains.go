package store

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"cellvisor/manifest"
)

// Domain is a domain's current revision.
type Domain struct {
	Name      string
	Pool      string
	Revision  int64
	SHA256    string
	Size      int64
	Deleted   bool
	UpdatedAt time.Time
}

// EdgeSequence is an edge's manifest sequence after a change.
type EdgeSequence struct {
	EdgeID   string
	Sequence int64
}

// Published is the outcome of publishing or deleting a domain: its new
// revision and its fan-out, which every edge concerned builds into its
// manifest at its next poll (Build).
type Published struct {
	Domain Domain
	// Edges are the edges whose manifest advanced at once, each with its
	// new sequence: none for a publish, a rollback or a delete, which fan
	// out instead.
	Edges []EdgeSequence
	// Fanout is the generation of the publish's fan-out.
	Fanout int64
	// Pending counts the edges where the domain is placed (where it was,
	// for a delete): those whose next poll builds a new manifest.
	Pending int
	// Skipped are the edges of the pool where the domain is not placed
	// (yet), each with the reason: too few ready cells, or no room. The
	// domain's next publish places it there if they have recovered.
	Skipped map[string]string
}

// Builder makes a domain revision's artifact bytes.
type Builder func(revision int64) ([]byte, error)

// PublishDomain stores the artifact build makes as the next revision of
// domain in pool, answering for hostnames, places it on the pool's edges
// that lack it, and fans it out (a constant number of rows): every edge
// with a cell of the domain builds its new entry, signed for it, at its
// next poll (Build). A hostname another domain
// answers for is refused with ErrConflict, as is the losing one of two
// concurrent first publishes of a domain (later ones take turns on the
// domain's row lock).
func (s *Store) PublishDomain(ctx context.Context, domain, pool string, hostnames []string, build Builder) (Published, error) {
	var out Published
	err := s.tx(ctx, func(tx *sql.Tx) error {
		// The generation counter first: it orders this change after every
		// other change to edges, pools' members and domains (CreateEdge
		// takes it first too), so neither misses what the other commits.
		gen, err := s.next(ctx, tx, "gen")
		if err != nil {
			return err
		}
		p, err := s.pool(ctx, tx, pool)
		if err != nil {
			return err
		}
		lock := ""
		if s.dialect == Postgres {
			lock = " FOR UPDATE"
		}
		var oldPool string
		var oldRev int64
		var deleted int
		// The next revision is above every one the domain had, rolled back
		// or not: an edge never sees a revision go down but on a rollback.
		err = tx.QueryRowContext(ctx, s.q(`SELECT pool, top_revision, deleted FROM domains WHERE name = ?`+lock), domain).Scan(&oldPool, &oldRev, &deleted)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		if deleted != 0 {
			oldPool = ""
		}
		if oldPool != "" && oldPool != pool {
			return fmt.Errorf("domain %s is in pool %s: publish it there, or move it (domain move) first: %w", domain, oldPool, ErrConflict)
		}
		if err := s.claim(ctx, tx, domain, hostnames); err != nil {
			return err
		}
		artifact, err := build(oldRev + 1)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(artifact)
		d := Domain{Name: domain, Pool: pool, Revision: oldRev + 1, SHA256: hex.EncodeToString(sum[:]), Size: int64(len(artifact)), UpdatedAt: fromMS(ms(s.Now()))}
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO artifacts (sha256, data, created_at) VALUES (?, ?, ?) ON CONFLICT (sha256) DO NOTHING`),
			d.SHA256, artifact, ms(d.UpdatedAt)); err != nil {
			return fmt.Errorf("store artifact: %w", err)
		}
		var rev int64
		err = tx.QueryRowContext(ctx, s.q(`INSERT INTO domains (name, pool, revision, top_revision, sha256, size, deleted, updated_at) VALUES (?, ?, ?, ?, ?, ?, 0, ?)
			ON CONFLICT (name) DO UPDATE SET pool = excluded.pool, revision = excluded.revision, top_revision = excluded.top_revision,
			sha256 = excluded.sha256, size = excluded.size, deleted = 0, updated_at = excluded.updated_at
			WHERE domains.top_revision < excluded.top_revision RETURNING revision`),
			domain, pool, d.Revision, d.Revision, d.SHA256, d.Size, ms(d.UpdatedAt)).Scan(&rev)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("revision %d published concurrently: %w", d.Revision, ErrConflict)
		}
		if err != nil {
			return fmt.Errorf("store domain: %w", err)
		}
		cert, fp := revisionTLS(artifact)
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO domain_revisions (domain, revision, pool, sha256, size, created_at, certificate, fingerprint) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`),
			domain, d.Revision, pool, d.SHA256, d.Size, ms(d.UpdatedAt), cert, fp); err != nil {
			return fmt.Errorf("store revision: %w", err)
		}
		out.Domain = d
		return s.placeAndFanOut(ctx, tx, gen, domain, p, &out)
	})
	if err != nil {
		return Published{}, fmt.Errorf("publish %s to %s: %w", domain, pool, err)
	}
	return out, nil
}

// placeAndFanOut places a revision just stored where the pool has cells
// (kept where it was placed; a move's target cells were placed when it
// started) and fans it out to every edge with a cell of the domain: both
// sides of a move. Publishes and rollbacks alike.
func (s *Store) placeAndFanOut(ctx context.Context, tx *sql.Tx, gen int64, domain string, p Pool, out *Published) error {
	var err error
	if _, out.Skipped, err = s.placePool(ctx, tx, domain, p, RoleActive); err != nil {
		return err
	}
	return s.fanOut(ctx, tx, gen, domain, p.Name, out)
}

// DeleteDomain withdraws a domain from every edge's manifest, fanned out.
func (s *Store) DeleteDomain(ctx context.Context, domain string) (Published, error) {
	var out Published
	err := s.tx(ctx, func(tx *sql.Tx) error {
		gen, err := s.next(ctx, tx, "gen") // first: see PublishDomain
		if err != nil {
			return err
		}
		d, err := s.domain(ctx, tx, domain, true)
		if err != nil {
			return err
		}
		if d.Deleted {
			return fmt.Errorf("domain %s: %w", domain, ErrNotFound)
		}
		d.UpdatedAt, d.Deleted = fromMS(ms(s.Now())), true
		if _, err := tx.ExecContext(ctx, s.q(`UPDATE domains SET deleted = 1, updated_at = ? WHERE name = ?`), ms(d.UpdatedAt), domain); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM hostnames WHERE domain = ?`), domain); err != nil {
			return err
		}
		out.Domain = d
		// The fan-out first, while the placements name the pools and edges
		// concerned.
		if err := s.fanOut(ctx, tx, gen, domain, d.Pool, &out); err != nil {
			return err
		}
		for _, q := range []string{`DELETE FROM placements WHERE domain = ?`, `DELETE FROM moves WHERE domain = ?`} {
			if _, err := tx.ExecContext(ctx, s.q(q), domain); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return Published{}, fmt.Errorf("delete %s: %w", domain, err)
	}
	return out, nil
}

// claim makes domain the one domain answering for hostnames.
func (s *Store) claim(ctx context.Context, tx *sql.Tx, domain string, hostnames []string) error {
	for _, h := range hostnames {
		var other string
		err := tx.QueryRowContext(ctx, s.q(`SELECT domain FROM hostnames WHERE hostname = ? AND domain <> ?`), h, domain).Scan(&other)
		if err == nil {
			return fmt.Errorf("hostname %s is domain %s's: %w", h, other, ErrConflict)
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
	}
	if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM hostnames WHERE domain = ?`), domain); err != nil {
		return err
	}
	for _, h := range hostnames {
		_, err := tx.ExecContext(ctx, s.q(`INSERT INTO hostnames (hostname, domain) VALUES (?, ?)`), h, domain)
		if isUnique(err) {
			return fmt.Errorf("hostname %s claimed concurrently: %w", h, ErrConflict)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (s *Store) domain(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, name string, forUpdate bool) (Domain, error) {
	var d Domain
	var deleted int
	var at int64
	lock := ""
	if forUpdate && s.dialect == Postgres {
		lock = " FOR UPDATE"
	}
	err := q.QueryRowContext(ctx, s.q(`SELECT name, pool, revision, sha256, size, deleted, updated_at FROM domains WHERE name = ?`+lock), name).
		Scan(&d.Name, &d.Pool, &d.Revision, &d.SHA256, &d.Size, &deleted, &at)
	if errors.Is(err, sql.ErrNoRows) {
		return Domain{}, fmt.Errorf("domain %s: %w", name, ErrNotFound)
	}
	d.Deleted, d.UpdatedAt = deleted != 0, fromMS(at)
	return d, err
}

// Domain returns one domain, or ErrNotFound.
func (s *Store) Domain(ctx context.Context, name string) (Domain, error) {
	return s.domain(ctx, s.db, name, false)
}

// Domains returns every domain not deleted, by name.
func (s *Store) Domains(ctx context.Context) ([]Domain, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT name, pool, revision, sha256, size, updated_at FROM domains WHERE deleted = 0 ORDER BY name`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Domain
	for rows.Next() {
		var d Domain
		var at int64
		if err := rows.Scan(&d.Name, &d.Pool, &d.Revision, &d.SHA256, &d.Size, &at); err != nil {
			return nil, err
		}
		d.UpdatedAt = fromMS(at)
		out = append(out, d)
	}
	return out, rows.Err()
}

// Entries returns up to limit entries of an edge's manifest at sequence
// seq, by domain, after domain after. ErrNotFound when seq is no longer
// (or not yet) readable.
func (s *Store) Entries(ctx context.Context, edgeID string, seq int64, after string, limit int) ([]manifest.Entry, error) {
	var current int64
	if err := s.db.QueryRowContext(ctx, s.q(`SELECT sequence FROM edges WHERE id = ?`), edgeID).Scan(&current); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return nil, fmt.Errorf("edge %s: %w", edgeID, ErrNotFound)
		}
		return nil, err
	}
	if seq < 1 || seq > current || seq <= current-keepSequences {
		return nil, fmt.Errorf("edge %s manifest sequence %d (current %d): %w", edgeID, seq, current, ErrNotFound)
	}
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT `+entryColumns+` FROM manifest_entries
		WHERE edge_id = ? AND from_seq <= ? AND (to_seq = 0 OR to_seq > ?) AND domain > ? ORDER BY domain LIMIT ?`),
		edgeID, seq, seq, after, limit)
	if err != nil {
		return nil, err
	}
	out, err := scanEntries(rows)
	if err != nil {
		return nil, err
	}
	// Publishes committed meanwhile may have pruned part of seq: then the
	// rows read are not the whole of it, and the page must not be served.
	if err := s.db.QueryRowContext(ctx, s.q(`SELECT sequence FROM edges WHERE id = ?`), edgeID).Scan(&current); err != nil {
		return nil, err
	}
	if seq <= current-keepSequences {
		return nil, fmt.Errorf("edge %s manifest sequence %d (current %d): %w", edgeID, seq, current, ErrNotFound)
	}
	return out, nil
}

// Artifact returns an artifact's bytes if a readable manifest of the edge
// names it: an edge gets only its own domains' configuration.
func (s *Store) Artifact(ctx context.Context, edgeID, sha string) ([]byte, error) {
	var data []byte
	err := s.db.QueryRowContext(ctx, s.q(`SELECT a.data FROM artifacts a WHERE a.sha256 = ?
		AND EXISTS (SELECT 1 FROM manifest_entries m WHERE m.edge_id = ? AND m.sha256 = a.sha256)`), sha, edgeID).Scan(&data)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("artifact %s for edge %s: %w", sha, edgeID, ErrNotFound)
	}
	return data, err
}

// Ack stores an acknowledgement, replacing an earlier one for the same
// sequence, and moves the edge's active sequence forward when it says the
// sequence is active.
func (s *Store) Ack(ctx context.Context, edgeID string, a manifest.Ack) error {
	return s.tx(ctx, func(tx *sql.Tx) error { return s.ack(ctx, tx, edgeID, a) })
}

// ack is Ack's statements.
func (s *Store) ack(ctx context.Context, tx *sql.Tx, edgeID string, a manifest.Ack) error {
	cells := strings.Join(a.Cells, ",")
	runtimes := ""
	if len(a.Runtimes) > 0 {
		b, err := json.Marshal(a.Runtimes)
		if err != nil {
			return fmt.Errorf("ack %d of edge %s: runtimes: %w", a.Sequence, edgeID, err)
		}
		runtimes = string(b)
	}
	_, err := tx.ExecContext(ctx, s.q(`INSERT INTO acks (edge_id, sequence, status, reason, cells, at, received_at, runtimes) VALUES (?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (edge_id, sequence) DO UPDATE SET status = excluded.status, reason = excluded.reason, cells = excluded.cells,
		at = excluded.at, received_at = excluded.received_at, runtimes = excluded.runtimes`), edgeID, a.Sequence, a.Status, a.Reason, cells, ms(a.At), ms(s.Now()), runtimes)
	if err != nil {
		return fmt.Errorf("ack %d of edge %s: %w", a.Sequence, edgeID, err)
	}
	if a.Status == manifest.AckApplied || a.Status == manifest.AckPartial {
		_, err = tx.ExecContext(ctx, s.q(`UPDATE edges SET active_sequence = ? WHERE id = ? AND active_sequence < ? AND sequence >= ?`), a.Sequence, edgeID, a.Sequence, a.Sequence)
	}
	return err
}

// Acks returns an edge's newest acknowledgements, newest first.
func (s *Store) Acks(ctx context.Context, edgeID string, limit int) ([]manifest.Ack, error) {
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT sequence, status, reason, cells, at, runtimes FROM acks WHERE edge_id = ? ORDER BY sequence DESC LIMIT ?`), edgeID, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []manifest.Ack
	for rows.Next() {
		var a manifest.Ack
		var cells, runtimes string
		var at int64
		if err := rows.Scan(&a.Sequence, &a.Status, &a.Reason, &cells, &at, &runtimes); err != nil {
			return nil, err
		}
		a.At = fromMS(at)
		if runtimes != "" {
			if err := json.Unmarshal([]byte(runtimes), &a.Runtimes); err != nil {
				return nil, fmt.Errorf("ack %d of edge %s: runtimes: %w", a.Sequence, edgeID, err)
			}
		}
		if cells != "" {
			a.Cells = strings.Split(cells, ",")
		}
		out = append(out, a)
	}
	return out, rows.Err()
}
