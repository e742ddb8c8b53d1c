package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"cellvisor/edgeapi"
	"cellvisor/manifest"
	"cellvisor/placement"
)

// Placement roles: a domain's cell serves it (active), receives it ahead
// of a switch (target), or keeps serving it while routing drains away
// (leaving).
const (
	RoleActive  = "active"
	RoleTarget  = "target"
	RoleLeaving = "leaving"
)

// ErrUnavailable is a placement refused because a pool lacks ready cells
// or room on an edge; the message says which and why.
var ErrUnavailable = errors.New("placement refused")

// Placed is one cell of a domain on an edge.
type Placed struct {
	Domain string
	EdgeID string
	Cell   string
	Pool   string
	Role   string
}

// Placements returns a domain's cells on every edge, by edge and cell.
func (s *Store) Placements(ctx context.Context, domain string) ([]Placed, error) {
	return s.placements(ctx, s.db, domain)
}

func (s *Store) placements(ctx context.Context, q querier, domain string) ([]Placed, error) {
	rows, err := q.QueryContext(ctx, s.q(`SELECT domain, edge_id, cell, pool, role FROM placements WHERE domain = ? ORDER BY edge_id, cell`), domain)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Placed
	for rows.Next() {
		var p Placed
		if err := rows.Scan(&p.Domain, &p.EdgeID, &p.Cell, &p.Pool, &p.Role); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// assignmentsAt is what an edge's next header signs: its cells and the
// policies of their pools.
func (s *Store) assignmentsAt(ctx context.Context, q querier, edgeID string) (*manifest.Assignments, error) {
	rows, err := q.QueryContext(ctx, s.q(`SELECT a.cell, a.pool, p.class, p.max_conns, p.rate, p.burst FROM assignments a
		JOIN pools p ON p.name = a.pool WHERE a.edge_id = ?`), edgeID)
	if err != nil {
		return nil, fmt.Errorf("assignments of edge %s: %w", edgeID, err)
	}
	defer rows.Close()
	a := &manifest.Assignments{Cells: map[string]string{}, Pools: map[string]manifest.PoolPolicy{}}
	for rows.Next() {
		var cell, pool string
		var pp manifest.PoolPolicy
		if err := rows.Scan(&cell, &pool, &pp.Class, &pp.MaxConns, &pp.Rate, &pp.Burst); err != nil {
			return nil, err
		}
		a.Cells[cell], a.Pools[pool] = pool, pp
	}
	return a, rows.Err()
}

// ReadyCells counts the cells of pool an edge's status report says are
// ready; ok is false when the edge has not reported yet.
func ReadyCells(status []byte, pool string) (n int, ok bool) {
	var sum edgeapi.Summary
	if len(status) == 0 || json.Unmarshal(status, &sum) != nil {
		return 0, false
	}
	for _, c := range sum.Slots {
		if c.Pool == pool && c.State == "ready" && !c.Drained {
			n++
		}
	}
	return n, true
}

// place gives domain its pool's replicas on an edge with role, keeping
// every cell it has there: a domain new to the edge is refused while the
// pool has fewer ready cells there than its minimum (an edge that never
// reported is not judged), or when too few cells are below the bound.
func (s *Store) place(ctx context.Context, tx *sql.Tx, domain string, p Pool, edgeID, role string) error {
	defer s.placed(time.Now())
	// A cell draining for its unassignment takes no new domains.
	rows, err := tx.QueryContext(ctx, s.q(`SELECT a.cell FROM assignments a WHERE a.edge_id = ? AND a.pool = ? AND NOT EXISTS
		(SELECT 1 FROM cell_drains d WHERE d.edge_id = a.edge_id AND d.cell = a.cell AND d.state IN ('waiting', 'draining'))`), edgeID, p.Name)
	if err != nil {
		return err
	}
	var cells []string
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			rows.Close()
			return err
		}
		cells = append(cells, c)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	rows, err = tx.QueryContext(ctx, s.q(`SELECT domain, cell FROM placements WHERE edge_id = ? AND pool = ? ORDER BY domain, cell`), edgeID, p.Name)
	if err != nil {
		return err
	}
	current := placement.Placement{}
	for rows.Next() {
		var d, c string
		if err := rows.Scan(&d, &c); err != nil {
			rows.Close()
			return err
		}
		current[d] = append(current[d], c)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	have := current[domain]
	if len(have) >= p.Replicas {
		return nil
	}
	if len(have) == 0 && p.MinReady > 0 {
		var status string
		if err := tx.QueryRowContext(ctx, s.q(`SELECT status FROM edges WHERE id = ?`), edgeID).Scan(&status); err != nil {
			return err
		}
		if n, ok := ReadyCells([]byte(status), p.Name); ok && n < p.MinReady {
			return fmt.Errorf("pool %s on edge %s has %d ready cell(s), its minimum is %d: %w", p.Name, edgeID, n, p.MinReady, ErrUnavailable)
		}
	}
	domains := make([]string, 0, len(current)+1)
	for d := range current {
		domains = append(domains, d)
	}
	domains = append(domains, domain)
	out, _, err := placement.Place(placement.Pool{Replicas: p.Replicas, Bound: p.Bound}, edgeID, cells, current, domains)
	if err != nil {
		return fmt.Errorf("pool %s on edge %s: %v: %w", p.Name, edgeID, err, ErrUnavailable)
	}
	for _, c := range out[domain] {
		if slices.Contains(have, c) {
			continue
		}
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO placements (domain, edge_id, cell, pool, role, created_at) VALUES (?, ?, ?, ?, ?, ?)`),
			domain, edgeID, c, p.Name, role, ms(s.Now())); err != nil {
			return fmt.Errorf("place %s on %s of edge %s: %w", domain, c, edgeID, err)
		}
	}
	return nil
}

// placePool places domain with role on every edge where pool has a cell
// and returns those edges. An edge that refuses a new placement (too few
// ready cells, no room) is skipped, with its reason in skipped: one edge
// down does not stop a fleet. Only when every edge refuses is the whole
// placement refused, with the first reason.
func (s *Store) placePool(ctx context.Context, tx *sql.Tx, domain string, p Pool, role string) (placed []string, skipped map[string]string, err error) {
	ids, err := s.strings(ctx, tx, `SELECT DISTINCT edge_id FROM assignments WHERE pool = ? ORDER BY edge_id`, p.Name)
	if err != nil {
		return nil, nil, err
	}
	// A revision after the first finds the domain placed on most edges:
	// counted in one query, not read edge by edge.
	held := map[string]int{}
	rows, err := tx.QueryContext(ctx, s.q(`SELECT edge_id, COUNT(*) FROM placements WHERE domain = ? AND pool = ? GROUP BY edge_id`), domain, p.Name)
	if err != nil {
		return nil, nil, err
	}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			rows.Close()
			return nil, nil, err
		}
		held[id] = n
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	var first error
	for _, id := range ids {
		if held[id] >= p.Replicas {
			placed = append(placed, id)
			continue
		}
		err := s.place(ctx, tx, domain, p, id, role)
		switch {
		case errors.Is(err, ErrUnavailable):
			if first == nil {
				first = err
			}
			if skipped == nil {
				skipped = map[string]string{}
			}
			skipped[id] = err.Error()
		case err != nil:
			return nil, nil, err
		default:
			placed = append(placed, id)
		}
	}
	if len(placed) == 0 && first != nil {
		return nil, nil, first
	}
	return placed, skipped, nil
}

// entryFor is domain's entry on an edge as it should be now: its current
// revision, for every cell it has there; ok is false when it has none.
func (s *Store) entryFor(ctx context.Context, tx *sql.Tx, domain, edgeID string) (manifest.Entry, bool, error) {
	return s.entryWith(ctx, tx, domain, edgeID, true)
}

// entryWith is entryFor; without seal, a key the entry would carry is
// only named (its KeyID set, nothing sealed): enough to compare entries.
func (s *Store) entryWith(ctx context.Context, tx *sql.Tx, domain, edgeID string, seal bool) (manifest.Entry, bool, error) {
	var d Domain
	var deleted int
	var top int64
	err := tx.QueryRowContext(ctx, s.q(`SELECT pool, revision, top_revision, sha256, size, deleted FROM domains WHERE name = ?`), domain).
		Scan(&d.Pool, &d.Revision, &top, &d.SHA256, &d.Size, &deleted)
	if errors.Is(err, sql.ErrNoRows) || deleted != 0 {
		return manifest.Entry{}, false, nil
	}
	if err != nil {
		return manifest.Entry{}, false, err
	}
	cells, err := s.strings(ctx, tx, `SELECT cell FROM placements WHERE domain = ? AND edge_id = ? ORDER BY cell`, domain, edgeID)
	if err != nil || len(cells) == 0 {
		return manifest.Entry{}, false, err
	}
	// The entry names its artifact's pool (the current revision's), which
	// is the pool the domain leaves until a move finishes, whatever cells
	// serve it: the cells it names are the edge's to serve it with.
	var fp string
	err = tx.QueryRowContext(ctx, s.q(`SELECT pool, fingerprint FROM domain_revisions WHERE domain = ? AND revision = ?`), domain, d.Revision).Scan(&d.Pool, &fp)
	if err != nil {
		return manifest.Entry{}, false, fmt.Errorf("revision %d of %s: %w", d.Revision, domain, err)
	}
	key, err := s.sealFor(ctx, tx, edgeID, domain, fp, seal)
	if err != nil {
		return manifest.Entry{}, false, err
	}
	sort.Strings(cells)
	return manifest.Entry{Domain: domain, Pool: d.Pool, Revision: d.Revision, Size: d.Size, SHA256: d.SHA256,
		Rollback: d.Revision < top, Cells: cells, Key: key}, true, nil
}

// reemit gives each edge of ids (and, for a domain, every edge where it
// has an entry or a cell) a new sequence: domain's entry replaced by the
// one entryFor makes, or none; every other entry carried over as it is.
// The header is signed again, with the edge's assignments as they are now.
func (s *Store) reemit(ctx context.Context, tx *sql.Tx, gen int64, domain string, ids []string, sign Signer) ([]EdgeSequence, error) {
	if domain != "" {
		more, err := s.strings(ctx, tx, `SELECT edge_id FROM placements WHERE domain = ? UNION SELECT edge_id FROM manifest_entries WHERE domain = ? AND to_seq = 0`, domain, domain)
		if err != nil {
			return nil, err
		}
		ids = append(slices.Clone(ids), more...)
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	if len(ids) == 0 {
		return nil, nil
	}
	k, err := s.keyring(ctx, tx, sign)
	if err != nil {
		return nil, err
	}
	var out []EdgeSequence
	for _, id := range ids { // in id order: see Touch
		seq, err := s.bump(ctx, tx, gen, id)
		if err != nil {
			return nil, err
		}
		if domain != "" {
			if _, err := tx.ExecContext(ctx, s.q(`UPDATE manifest_entries SET to_seq = ? WHERE edge_id = ? AND domain = ? AND to_seq = 0`), seq, id, domain); err != nil {
				return nil, err
			}
			e, ok, err := s.entryFor(ctx, tx, domain, id)
			if err != nil {
				return nil, err
			}
			if ok {
				if err := s.insertEntry(ctx, tx, id, seq, k.entry(id, e)); err != nil {
					return nil, err
				}
			}
		}
		if err := s.finishSequence(ctx, tx, k, id, seq); err != nil {
			return nil, err
		}
		out = append(out, EdgeSequence{EdgeID: id, Sequence: seq})
	}
	return out, nil
}

// AssignCell assigns an edge's cell to pool ("" unassigns it) and
// advances the edge's manifest, whose signed assignments carry the change.
// A cell that holds domains is refused (ErrConflict, with how many):
// ChangeCell moves them first.
func (s *Store) AssignCell(ctx context.Context, edgeID, cell, pool string, sign Signer) (EdgeSequence, error) {
	var out EdgeSequence
	err := s.tx(ctx, func(tx *sql.Tx) error {
		gen, err := s.next(ctx, tx, "gen")
		if err != nil {
			return err
		}
		old, err := s.checkCell(ctx, tx, edgeID, cell, pool)
		if err != nil {
			return err
		}
		held, err := s.count(ctx, tx, `SELECT COUNT(*) FROM placements WHERE edge_id = ? AND cell = ?`, edgeID, cell)
		if err != nil {
			return err
		}
		if held > 0 {
			return fmt.Errorf("%s holds %d domain(s) of %s: unassign it through the admin API, which moves them first: %w", cell, held, old, ErrConflict)
		}
		out, err = s.setAssignment(ctx, tx, gen, edgeID, cell, pool, nil, sign)
		return err
	})
	if err != nil {
		return EdgeSequence{}, fmt.Errorf("assign %s of edge %s to %q: %w", cell, edgeID, pool, err)
	}
	return out, nil
}

// checkCell checks that cell is one of the edge's, that pool ("" for
// none) exists and differs from the cell's, and that no drain of the cell
// is under way; it returns the cell's pool now ("" when unassigned).
func (s *Store) checkCell(ctx context.Context, tx *sql.Tx, edgeID, cell, pool string) (string, error) {
	var slots int
	if err := tx.QueryRowContext(ctx, s.q(`SELECT slots FROM edges WHERE id = ?`), edgeID).Scan(&slots); errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("edge %s: %w", edgeID, ErrNotFound)
	} else if err != nil {
		return "", err
	}
	var n int
	if _, err := fmt.Sscanf(cell, "cell-%02d", &n); err != nil || len(cell) != 7 || n < 1 || n > slots {
		return "", fmt.Errorf("cell %q: the edge has cell-01 to cell-%02d: %w", cell, slots, ErrInvalid)
	}
	if pool != "" {
		if _, err := s.pool(ctx, tx, pool); err != nil {
			return "", err
		}
	}
	var old string
	err := tx.QueryRowContext(ctx, s.q(`SELECT pool FROM assignments WHERE edge_id = ? AND cell = ?`), edgeID, cell).Scan(&old)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return "", err
	}
	if d, err := s.drain(ctx, tx, edgeID, cell, true); err == nil && d.Active() {
		return "", fmt.Errorf("%s is draining already, for %s (%s): %w", cell, d.target(), d.State, ErrConflict)
	} else if err != nil && !errors.Is(err, ErrNotFound) {
		return "", err
	}
	switch {
	case old == pool && pool == "":
		return "", fmt.Errorf("%s is not assigned: %w", cell, ErrConflict)
	case old == pool:
		return "", fmt.Errorf("%s is already assigned to %s: %w", cell, pool, ErrConflict)
	}
	return old, nil
}

// setAssignment assigns cell to pool ("" unassigns it) and gives the edge
// a new sequence carrying it, with domains' entries made again.
func (s *Store) setAssignment(ctx context.Context, tx *sql.Tx, gen int64, edgeID, cell, pool string, domains []string, sign Signer) (EdgeSequence, error) {
	if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM assignments WHERE edge_id = ? AND cell = ?`), edgeID, cell); err != nil {
		return EdgeSequence{}, err
	}
	if pool != "" {
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO assignments (edge_id, cell, pool) VALUES (?, ?, ?)`), edgeID, cell, pool); err != nil {
			return EdgeSequence{}, err
		}
	}
	return s.reemitEdge(ctx, tx, gen, edgeID, domains, sign)
}

// reemitEdge gives one edge a new sequence: each of domains' entries
// replaced by the one entryFor makes (or none), every other entry carried
// over, the header signed again with the edge's assignments as they are.
func (s *Store) reemitEdge(ctx context.Context, tx *sql.Tx, gen int64, edgeID string, domains []string, sign Signer) (EdgeSequence, error) {
	k, err := s.keyring(ctx, tx, sign)
	if err != nil {
		return EdgeSequence{}, err
	}
	seq, err := s.bump(ctx, tx, gen, edgeID)
	if err != nil {
		return EdgeSequence{}, err
	}
	for _, d := range domains {
		if _, err := tx.ExecContext(ctx, s.q(`UPDATE manifest_entries SET to_seq = ? WHERE edge_id = ? AND domain = ? AND to_seq = 0`), seq, edgeID, d); err != nil {
			return EdgeSequence{}, err
		}
		e, ok, err := s.entryFor(ctx, tx, d, edgeID)
		if err != nil {
			return EdgeSequence{}, err
		}
		if ok {
			if err := s.insertEntry(ctx, tx, edgeID, seq, k.entry(edgeID, e)); err != nil {
				return EdgeSequence{}, err
			}
		}
	}
	if err := s.finishSequence(ctx, tx, k, edgeID, seq); err != nil {
		return EdgeSequence{}, err
	}
	return EdgeSequence{EdgeID: edgeID, Sequence: seq}, nil
}
