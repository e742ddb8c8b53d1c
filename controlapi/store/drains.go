package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"cellvisor/controlapi/adminapi"
	"cellvisor/placement"
)

// Drain is a cell's unassignment (To "") or reassignment to pool To while
// it holds domains, done target-first like a move: its domains are placed
// on the other cells of its pool on the edge and delivered there
// (waiting); once every new cell applied them and reports ready, routing
// switches to them and the cell keeps serving for its pool's drain
// interval (draining); then the cell lets them go and its assignment
// changes, in one sequence (done). A new cell that refuses or is not
// ready in time fails the drain: the cell stays assigned and serving.
// States are a move's (adminapi.MoveWaiting, MoveDraining, MoveDone, MoveFailed).
type Drain struct {
	EdgeID, Cell, From, To, State, Reason string
	// Domains are the ones the cell held when the drain started.
	Domains []string
	Steps   []adminapi.MoveStep
	// Deadline is when a drain still waiting for the new cells fails.
	StartedAt, Deadline, DrainUntil time.Time
}

// Active reports a drain under way.
func (d Drain) Active() bool {
	return d.State == adminapi.MoveWaiting || d.State == adminapi.MoveDraining
}

func (d Drain) target() string {
	if d.To == "" {
		return "its unassignment"
	}
	return "its reassignment to " + d.To
}

func (d *Drain) step(now time.Time, step, detail string) {
	d.Steps = append(d.Steps, adminapi.MoveStep{Step: step, At: fromMS(ms(now)), Detail: detail})
}

const drainColumns = `edge_id, cell, from_pool, to_pool, state, reason, domains, steps, started_at, deadline, drain_until`

func scanDrain(row interface{ Scan(...any) error }) (Drain, error) {
	var d Drain
	var domains, steps string
	var started, deadline, until int64
	if err := row.Scan(&d.EdgeID, &d.Cell, &d.From, &d.To, &d.State, &d.Reason, &domains, &steps, &started, &deadline, &until); err != nil {
		return Drain{}, err
	}
	if domains != "" {
		d.Domains = strings.Split(domains, ",")
	}
	d.StartedAt, d.Deadline, d.DrainUntil = fromMS(started), fromMS(deadline), fromMS(until)
	if err := json.Unmarshal([]byte(steps), &d.Steps); err != nil {
		return Drain{}, fmt.Errorf("drain of %s on edge %s: steps: %w", d.Cell, d.EdgeID, err)
	}
	return d, nil
}

func (s *Store) drain(ctx context.Context, q querier, edgeID, cell string, forUpdate bool) (Drain, error) {
	lock := ""
	if forUpdate && s.dialect == Postgres {
		lock = " FOR UPDATE"
	}
	d, err := scanDrain(q.QueryRowContext(ctx, s.q(`SELECT `+drainColumns+` FROM cell_drains WHERE edge_id = ? AND cell = ?`+lock), edgeID, cell))
	if errors.Is(err, sql.ErrNoRows) {
		return Drain{}, fmt.Errorf("drain of %s on edge %s: %w", cell, edgeID, ErrNotFound)
	}
	return d, err
}

// Drain returns a cell's latest drain, or ErrNotFound.
func (s *Store) Drain(ctx context.Context, edgeID, cell string) (Drain, error) {
	return s.drain(ctx, s.db, edgeID, cell, false)
}

// Drains returns an edge's cell drains, the latest of each cell, by cell.
func (s *Store) Drains(ctx context.Context, edgeID string) ([]Drain, error) {
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT `+drainColumns+` FROM cell_drains WHERE edge_id = ? ORDER BY cell`), edgeID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Drain
	for rows.Next() {
		d, err := scanDrain(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

// ActiveDrains returns the drains under way, as (edge, cell) pairs.
func (s *Store) ActiveDrains(ctx context.Context) ([][2]string, error) {
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT edge_id, cell FROM cell_drains WHERE state IN ('waiting', 'draining') ORDER BY edge_id, cell`))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out [][2]string
	for rows.Next() {
		var k [2]string
		if err := rows.Scan(&k[0], &k[1]); err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

func (s *Store) saveDrain(ctx context.Context, tx *sql.Tx, d Drain) error {
	steps, err := json.Marshal(d.Steps)
	if err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, s.q(`INSERT INTO cell_drains (`+drainColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (edge_id, cell) DO UPDATE SET from_pool = excluded.from_pool, to_pool = excluded.to_pool, state = excluded.state,
		reason = excluded.reason, domains = excluded.domains, steps = excluded.steps, started_at = excluded.started_at,
		deadline = excluded.deadline, drain_until = excluded.drain_until`),
		d.EdgeID, d.Cell, d.From, d.To, d.State, d.Reason, strings.Join(d.Domains, ","), string(steps), ms(d.StartedAt), ms(d.Deadline), ms(d.DrainUntil))
	return err
}

// ChangeCell assigns an edge's cell to pool ("" unassigns it). A cell that
// holds no domain changes at once, in a new sequence (drain nil). One that
// holds domains drains first (see Drain): its domains are placed on the
// other cells of its pool on the edge with placement.Place, keeping every
// cell they have, and delivered there in a new sequence; the cell stays
// assigned and serving until they are ready there. When one of its
// domains has nowhere to go (no other cell, or every other cell at the
// pool's bound) the change is refused (ErrUnavailable, naming the domain
// and the bound) and nothing changes; so it is while one of them is
// moving between pools or already leaving another cell (ErrConflict).
func (s *Store) ChangeCell(ctx context.Context, edgeID, cell, pool string, readyWithin time.Duration, sign Signer) (EdgeSequence, *Drain, error) {
	var out EdgeSequence
	var drain *Drain
	err := s.tx(ctx, func(tx *sql.Tx) error {
		gen, err := s.next(ctx, tx, "gen")
		if err != nil {
			return err
		}
		old, err := s.checkCell(ctx, tx, edgeID, cell, pool)
		if err != nil {
			return err
		}
		held, err := s.strings(ctx, tx, `SELECT domain FROM placements WHERE edge_id = ? AND cell = ? ORDER BY domain`, edgeID, cell)
		if err != nil {
			return err
		}
		if len(held) == 0 {
			out, err = s.setAssignment(ctx, tx, gen, edgeID, cell, pool, nil, sign)
			return err
		}
		for _, d := range held {
			if m, err := s.move(ctx, tx, d, false); err == nil && m.Active() {
				return fmt.Errorf("domain %s on %s is moving to %s (%s): wait for the move or cancel it: %w", d, cell, m.To, m.State, ErrConflict)
			} else if err != nil && !errors.Is(err, ErrNotFound) {
				return err
			}
			n, err := s.count(ctx, tx, `SELECT COUNT(*) FROM placements WHERE domain = ? AND edge_id = ? AND role <> 'active'`, d, edgeID)
			if err != nil {
				return err
			}
			if n > 0 {
				return fmt.Errorf("domain %s on %s is changing cells on the edge already (another cell drains): %w", d, cell, ErrConflict)
			}
		}
		p, err := s.pool(ctx, tx, old)
		if err != nil {
			return err
		}
		moved, err := s.replace(ctx, tx, p, edgeID, cell, held)
		if err != nil {
			return err
		}
		now := s.Now()
		d := Drain{EdgeID: edgeID, Cell: cell, From: old, To: pool, State: adminapi.MoveWaiting, Domains: held,
			StartedAt: fromMS(ms(now)), Deadline: fromMS(ms(now.Add(readyWithin)))}
		d.step(now, "started", fmt.Sprintf("%s holds %d domain(s) of %s; then %s", cell, len(held), old, strings.TrimPrefix(d.target(), "its ")))
		d.step(now, "placed", moved)
		if out, err = s.reemitEdge(ctx, tx, gen, edgeID, held, sign); err != nil {
			return err
		}
		d.step(now, "delivering", fmt.Sprintf("to the new cells in sequence %d", out.Sequence))
		drain = &d
		return s.saveDrain(ctx, tx, d)
	})
	if err != nil {
		return EdgeSequence{}, nil, fmt.Errorf("assign %s of edge %s to %q: %w", cell, edgeID, pool, err)
	}
	return out, drain, nil
}

// replace places held (the domains on cell) on the other cells of pool p
// on the edge as targets, each keeping its other cells, and says where
// each went. Cells draining themselves take none.
func (s *Store) replace(ctx context.Context, tx *sql.Tx, p Pool, edgeID, cell string, held []string) (string, error) {
	cells, err := s.strings(ctx, tx, `SELECT a.cell FROM assignments a WHERE a.edge_id = ? AND a.pool = ? AND a.cell <> ? AND NOT EXISTS
		(SELECT 1 FROM cell_drains d WHERE d.edge_id = a.edge_id AND d.cell = a.cell AND d.state IN ('waiting', 'draining')) ORDER BY a.cell`,
		edgeID, p.Name, cell)
	if err != nil {
		return "", err
	}
	rows, err := tx.QueryContext(ctx, s.q(`SELECT domain, cell FROM placements WHERE edge_id = ? AND pool = ? ORDER BY domain, cell`), edgeID, p.Name)
	if err != nil {
		return "", err
	}
	current := placement.Placement{}
	for rows.Next() {
		var d, c string
		if err := rows.Scan(&d, &c); err != nil {
			rows.Close()
			return "", err
		}
		current[d] = append(current[d], c)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return "", err
	}
	// Every domain of the pool on the edge is placed, so that the loads
	// (and the bound) count them all; only held ones change.
	domains := make([]string, 0, len(current))
	for d := range current {
		domains = append(domains, d)
	}
	out, _, err := placement.Place(placement.Pool{Replicas: p.Replicas, Bound: p.Bound}, edgeID, cells, current, domains)
	if err != nil {
		return "", fmt.Errorf("%s's domains have nowhere to go: pool %s has %d other cell(s) on edge %s (%s), at most %d domain(s) a cell: %v: %w",
			cell, p.Name, len(cells), edgeID, strings.Join(cells, ","), p.Bound, err, ErrUnavailable)
	}
	var went []string
	for _, d := range held {
		var to []string
		for _, c := range out[d] {
			if slices.Contains(current[d], c) {
				continue
			}
			if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO placements (domain, edge_id, cell, pool, role, created_at) VALUES (?, ?, ?, ?, ?, ?)`),
				d, edgeID, c, p.Name, RoleTarget, ms(s.Now())); err != nil {
				return "", fmt.Errorf("place %s on %s of edge %s: %w", d, c, edgeID, err)
			}
			to = append(to, c)
		}
		went = append(went, d+" → "+strings.Join(to, ","))
	}
	return strings.Join(went, "; "), nil
}

// StepDrain drives a cell's drain one step when it can take one, as
// StepMove does a move: a waiting drain switches when every new cell
// applied its domains and reports ready, and fails when one refused them
// or the deadline passed; a draining one finishes after the pool's drain
// interval. It returns the drain as it is after and what it waits for.
func (s *Store) StepDrain(ctx context.Context, edgeID, cell string, sign Signer) (Drain, string, error) {
	d, err := s.Drain(ctx, edgeID, cell)
	if err != nil {
		return Drain{}, "", err
	}
	now := s.Now()
	switch d.State {
	case adminapi.MoveWaiting:
		waiting, refused, err := s.drainReady(ctx, d)
		if err != nil {
			return d, "", err
		}
		switch {
		case refused != "":
			d, err = s.failDrain(ctx, edgeID, cell, refused, sign)
		case waiting == "":
			d, err = s.switchDrain(ctx, edgeID, cell)
		case !now.Before(d.Deadline):
			d, err = s.failDrain(ctx, edgeID, cell, "not ready in time: "+waiting, sign)
		default:
			return d, waiting, nil
		}
		if errors.Is(err, ErrConflict) { // another replica took the step
			d, err = s.Drain(ctx, edgeID, cell)
		}
		return d, "", err
	case adminapi.MoveDraining:
		if now.Before(d.DrainUntil) {
			return d, "the drain interval", nil
		}
		d, err = s.finishDrain(ctx, edgeID, cell, sign)
		if errors.Is(err, ErrConflict) {
			d, err = s.Drain(ctx, edgeID, cell)
		}
		return d, "", err
	}
	return d, "", nil
}

// DrainWaitingFor says what a drain waits for now (empty: nothing).
func (s *Store) DrainWaitingFor(ctx context.Context, d Drain) (string, error) {
	switch d.State {
	case adminapi.MoveWaiting:
		waiting, refused, err := s.drainReady(ctx, d)
		if refused != "" {
			return refused, err
		}
		return waiting, err
	case adminapi.MoveDraining:
		return "the drain interval, until " + d.DrainUntil.Format(time.RFC3339), nil
	}
	return "", nil
}

func (s *Store) drainReady(ctx context.Context, d Drain) (waiting, refused string, err error) {
	for _, dom := range d.Domains {
		waiting, refused, err = s.targetsReady(ctx, dom, d.EdgeID)
		if err != nil || waiting != "" || refused != "" {
			return waiting, refused, err
		}
	}
	return "", "", nil
}

// lockDrain starts a step: the drain, locked, which must be in state want.
func (s *Store) lockDrain(ctx context.Context, tx *sql.Tx, edgeID, cell, want string) (Drain, error) {
	d, err := s.drain(ctx, tx, edgeID, cell, true)
	if err != nil {
		return Drain{}, err
	}
	if d.State != want {
		return Drain{}, fmt.Errorf("the drain of %s is %s, not %s: %w", cell, d.State, want, ErrConflict)
	}
	return d, nil
}

// switchDrain switches routing to the new cells: they are active, the
// cell is leaving and keeps serving for its pool's drain interval.
// Nothing changes on the edge.
func (s *Store) switchDrain(ctx context.Context, edgeID, cell string) (Drain, error) {
	var d Drain
	err := s.tx(ctx, func(tx *sql.Tx) error {
		if _, err := s.next(ctx, tx, "gen"); err != nil {
			return err
		}
		var err error
		if d, err = s.lockDrain(ctx, tx, edgeID, cell, adminapi.MoveWaiting); err != nil {
			return err
		}
		p, err := s.pool(ctx, tx, d.From)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, s.q(`UPDATE placements SET role = 'leaving' WHERE edge_id = ? AND cell = ? AND role = 'active'`), edgeID, cell); err != nil {
			return err
		}
		for _, dom := range d.Domains {
			if _, err := tx.ExecContext(ctx, s.q(`UPDATE placements SET role = 'active' WHERE domain = ? AND edge_id = ? AND role = 'target'`), dom, edgeID); err != nil {
				return err
			}
		}
		now := s.Now()
		d.State, d.DrainUntil = adminapi.MoveDraining, fromMS(ms(now.Add(p.Drain)))
		d.step(now, "applied", "every new cell applied the domains and reports ready")
		d.step(now, "switched", "routing publishes the new cells; "+cell+" drains for "+p.Drain.String())
		return s.saveDrain(ctx, tx, d)
	})
	return d, err
}

// finishDrain lets the cell go: its domains are withdrawn from it and its
// assignment changes, in one sequence.
func (s *Store) finishDrain(ctx context.Context, edgeID, cell string, sign Signer) (Drain, error) {
	var d Drain
	err := s.tx(ctx, func(tx *sql.Tx) error {
		gen, err := s.next(ctx, tx, "gen")
		if err != nil {
			return err
		}
		if d, err = s.lockDrain(ctx, tx, edgeID, cell, adminapi.MoveDraining); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM placements WHERE edge_id = ? AND cell = ?`), edgeID, cell); err != nil {
			return err
		}
		es, err := s.setAssignment(ctx, tx, gen, edgeID, cell, d.To, d.Domains, sign)
		if err != nil {
			return err
		}
		d.State = adminapi.MoveDone
		d.step(s.Now(), "drained", fmt.Sprintf("withdrawn from %s; %s in sequence %d", cell, strings.TrimPrefix(d.target(), "its "), es.Sequence))
		return s.saveDrain(ctx, tx, d)
	})
	return d, err
}

// failDrain ends a waiting drain: the new cells let the domains go, the
// cell was never touched and stays assigned.
func (s *Store) failDrain(ctx context.Context, edgeID, cell, reason string, sign Signer) (Drain, error) {
	var d Drain
	err := s.tx(ctx, func(tx *sql.Tx) error {
		gen, err := s.next(ctx, tx, "gen")
		if err != nil {
			return err
		}
		if d, err = s.lockDrain(ctx, tx, edgeID, cell, adminapi.MoveWaiting); err != nil {
			return err
		}
		for _, dom := range d.Domains {
			if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM placements WHERE domain = ? AND edge_id = ? AND role = 'target'`), dom, edgeID); err != nil {
				return err
			}
		}
		d.State, d.Reason = adminapi.MoveFailed, reason
		d.step(s.Now(), adminapi.MoveFailed, reason)
		if err := s.saveDrain(ctx, tx, d); err != nil {
			return err
		}
		_, err = s.reemitEdge(ctx, tx, gen, edgeID, d.Domains, sign)
		return err
	})
	return d, err
}
