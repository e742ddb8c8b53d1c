package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"cellvisor/manifest"
)

// Pool is a service class's pool: how its domains are placed on the cells
// assigned to it, and what each of those cells enforces.
type Pool struct {
	Name  string
	Class string
	// Replicas is how many distinct cells of an edge serve each domain:
	// 1 for shared and quarantine pools, 1–3 for reserved and dedicated.
	Replicas int
	// Bound is the most domains one cell holds; 0 means none.
	Bound int
	// MinReady is the fewest ready cells the pool needs on an edge to take
	// new placements there.
	MinReady int
	// Drain is how long a domain moving out of the pool keeps being served
	// by its cells after routing switched away.
	Drain time.Duration
	// MaxConns, Rate and Burst are each cell's limits (manifest.PoolPolicy).
	MaxConns, Rate, Burst int
	CreatedAt             time.Time
}

// ErrInvalid is a pool's (or a placement request's) number out of its rule.
var ErrInvalid = errors.New("invalid")

// DefaultPool is a new pool of class with the shipped defaults; see
// docs/placement.md for why these numbers.
func DefaultPool(name, class string) Pool {
	// Shared and quarantine pools have no minimum by default: they
	// usually have one cell per edge, and an edge restarting or offline
	// must not stop new domains reaching the rest of the fleet (it catches
	// up when back). Reserved and dedicated pools have cells to spare.
	p := Pool{Name: name, Class: class, Replicas: 1, Bound: 5000, MinReady: 0, Drain: time.Minute, MaxConns: 4096, Rate: 200, Burst: 400}
	switch class {
	case "quarantine":
		p.Bound, p.Drain, p.MaxConns, p.Rate, p.Burst = 1000, 30*time.Second, 512, 20, 40
	case "reserved", "dedicated":
		p.Bound, p.MinReady, p.Rate, p.Burst = 500, 1, 500, 1000
	}
	return p
}

// Validate checks a pool's numbers against their rules.
func (p Pool) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("pool %s: %s: %w", p.Name, fmt.Sprintf(format, args...), ErrInvalid)
	}
	switch {
	case (p.Class == "shared" || p.Class == "quarantine") && p.Replicas != 1:
		return bad("replicas %d: shared and quarantine pools keep one copy per edge", p.Replicas)
	case p.Replicas < 1 || p.Replicas > 3:
		return bad("replicas %d: reserved and dedicated pools take 1, 2 or 3", p.Replicas)
	case p.Bound < 0:
		return bad("bound %d: 0 (none) or more domains per cell", p.Bound)
	case p.MinReady < 0 || p.MinReady > 32:
		return bad("min_ready %d: 0–32 cells", p.MinReady)
	case p.Drain < 0 || p.Drain > 24*time.Hour:
		return bad("drain %s: 0–24h", p.Drain)
	case p.MaxConns < 0 || p.MaxConns > manifest.MaxPoolConns:
		return bad("max_conns %d: 0–%d", p.MaxConns, manifest.MaxPoolConns)
	case p.Rate < 0 || p.Rate > manifest.MaxPoolRate || p.Burst < 0 || p.Burst > manifest.MaxPoolRate:
		return bad("rate %d, burst %d: 0–%d", p.Rate, p.Burst, manifest.MaxPoolRate)
	}
	return nil
}

// Policy is what the pool's cells enforce.
func (p Pool) Policy() manifest.PoolPolicy {
	return manifest.PoolPolicy{Class: p.Class, MaxConns: p.MaxConns, Rate: p.Rate, Burst: p.Burst}
}

const poolColumns = `name, class, replicas, bound, min_ready, drain_ms, max_conns, rate, burst, created_at`

func scanPool(r scanner) (Pool, error) {
	var p Pool
	var drain, at int64
	err := r.Scan(&p.Name, &p.Class, &p.Replicas, &p.Bound, &p.MinReady, &drain, &p.MaxConns, &p.Rate, &p.Burst, &at)
	p.Drain, p.CreatedAt = time.Duration(drain)*time.Millisecond, fromMS(at)
	return p, err
}

// CreatePool creates a pool; ErrConflict when it exists.
func (s *Store) CreatePool(ctx context.Context, p Pool) (Pool, error) {
	if err := p.Validate(); err != nil {
		return Pool{}, err
	}
	p.CreatedAt = fromMS(ms(s.Now()))
	_, err := s.exec(ctx, `INSERT INTO pools (`+poolColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		p.Name, p.Class, p.Replicas, p.Bound, p.MinReady, p.Drain.Milliseconds(), p.MaxConns, p.Rate, p.Burst, ms(p.CreatedAt))
	if isUnique(err) {
		return Pool{}, fmt.Errorf("pool %s: %w", p.Name, ErrConflict)
	}
	if err != nil {
		return Pool{}, fmt.Errorf("create pool %s: %w", p.Name, err)
	}
	return p, nil
}

// Pool returns one pool, or ErrNotFound.
func (s *Store) Pool(ctx context.Context, name string) (Pool, error) {
	return s.pool(ctx, s.db, name)
}

func (s *Store) pool(ctx context.Context, q querier, name string) (Pool, error) {
	p, err := scanPool(q.QueryRowContext(ctx, s.q(`SELECT `+poolColumns+` FROM pools WHERE name = ?`), name))
	if errors.Is(err, sql.ErrNoRows) {
		return Pool{}, fmt.Errorf("pool %s: %w", name, ErrNotFound)
	}
	return p, err
}

// Pools returns every pool, by name.
func (s *Store) Pools(ctx context.Context) ([]Pool, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+poolColumns+` FROM pools ORDER BY name`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Pool
	for rows.Next() {
		p, err := scanPool(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// UpdatePool changes a pool's bound, minimum, drain interval and limits
// (its name, class and replicas stay) and, when its cells' limits changed,
// advances the manifest of every edge where it has a cell: the new policy
// reaches them signed.
func (s *Store) UpdatePool(ctx context.Context, p Pool, sign Signer) (Pool, []EdgeSequence, error) {
	var edges []EdgeSequence
	err := s.tx(ctx, func(tx *sql.Tx) error {
		gen, err := s.next(ctx, tx, "gen")
		if err != nil {
			return err
		}
		old, err := s.pool(ctx, tx, p.Name)
		if err != nil {
			return err
		}
		p.Class, p.Replicas, p.CreatedAt = old.Class, old.Replicas, old.CreatedAt
		if err := p.Validate(); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, s.q(`UPDATE pools SET bound = ?, min_ready = ?, drain_ms = ?, max_conns = ?, rate = ?, burst = ? WHERE name = ?`),
			p.Bound, p.MinReady, p.Drain.Milliseconds(), p.MaxConns, p.Rate, p.Burst, p.Name); err != nil {
			return err
		}
		if old.Policy() == p.Policy() {
			return nil
		}
		ids, err := s.strings(ctx, tx, `SELECT DISTINCT edge_id FROM assignments WHERE pool = ? ORDER BY edge_id`, p.Name)
		if err != nil {
			return err
		}
		edges, err = s.reemit(ctx, tx, gen, "", ids, sign)
		return err
	})
	if err != nil {
		return Pool{}, nil, fmt.Errorf("update pool %s: %w", p.Name, err)
	}
	return p, edges, nil
}

// DeletePool deletes a pool that has no domains and no cells.
func (s *Store) DeletePool(ctx context.Context, name string) error {
	err := s.tx(ctx, func(tx *sql.Tx) error {
		if _, err := s.next(ctx, tx, "gen"); err != nil {
			return err
		}
		if _, err := s.pool(ctx, tx, name); err != nil {
			return err
		}
		var domains, cells int
		if err := tx.QueryRowContext(ctx, s.q(`SELECT COUNT(*) FROM domains WHERE deleted = 0 AND pool = ?`), name).Scan(&domains); err != nil {
			return err
		}
		if err := tx.QueryRowContext(ctx, s.q(`SELECT COUNT(*) FROM assignments WHERE pool = ?`), name).Scan(&cells); err != nil {
			return err
		}
		var moving int
		if err := tx.QueryRowContext(ctx, s.q(`SELECT COUNT(*) FROM moves WHERE to_pool = ? AND state IN ('waiting', 'draining')`), name).Scan(&moving); err != nil {
			return err
		}
		if domains+cells+moving > 0 {
			return fmt.Errorf("pool %s still has %d domain(s), %d cell(s) and %d move(s) into it: %w", name, domains, cells, moving, ErrConflict)
		}
		_, err := tx.ExecContext(ctx, s.q(`DELETE FROM pools WHERE name = ?`), name)
		return err
	})
	if err != nil {
		return fmt.Errorf("delete pool %s: %w", name, err)
	}
	return nil
}

// strings runs a query of one text column.
func (s *Store) strings(ctx context.Context, q querier, query string, args ...any) ([]string, error) {
	rows, err := q.QueryContext(ctx, s.q(query), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// PoolCells returns a pool's cells on every edge, by edge id.
func (s *Store) PoolCells(ctx context.Context, pool string) (map[string][]string, error) {
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT edge_id, cell FROM assignments WHERE pool = ? ORDER BY edge_id, cell`), pool)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string][]string{}
	for rows.Next() {
		var e, c string
		if err := rows.Scan(&e, &c); err != nil {
			return nil, err
		}
		out[e] = append(out[e], c)
	}
	return out, rows.Err()
}
