package store

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"cellvisor/controlapi/adminapi"
	"cellvisor/edgeapi"
	"cellvisor/manifest"
)

// Move is a domain's move from its active pool to a target pool. Its
// states are adminapi's (MoveWaiting … MoveCancelled).
type Move struct {
	Domain, From, To, State, Reason string
	Steps                           []adminapi.MoveStep
	StartedAt                       time.Time
	// Deadline is when a move still waiting for its target fails.
	Deadline time.Time
	// DrainUntil is when the source cells let go, once switched.
	DrainUntil time.Time
}

// Active reports a move under way.
func (m Move) Active() bool {
	return m.State == adminapi.MoveWaiting || m.State == adminapi.MoveDraining
}

func (s *Store) move(ctx context.Context, q querier, domain string, forUpdate bool) (Move, error) {
	lock := ""
	if forUpdate && s.dialect == Postgres {
		lock = " FOR UPDATE"
	}
	var m Move
	var steps string
	var started, deadline, drain int64
	err := q.QueryRowContext(ctx, s.q(`SELECT domain, from_pool, to_pool, state, reason, steps, started_at, deadline, drain_until FROM moves WHERE domain = ?`+lock), domain).
		Scan(&m.Domain, &m.From, &m.To, &m.State, &m.Reason, &steps, &started, &deadline, &drain)
	if errors.Is(err, sql.ErrNoRows) {
		return Move{}, fmt.Errorf("move of %s: %w", domain, ErrNotFound)
	}
	if err != nil {
		return Move{}, err
	}
	m.StartedAt, m.Deadline, m.DrainUntil = fromMS(started), fromMS(deadline), fromMS(drain)
	if err := json.Unmarshal([]byte(steps), &m.Steps); err != nil {
		return Move{}, fmt.Errorf("move of %s: steps: %w", domain, err)
	}
	return m, nil
}

// Move returns a domain's latest move, or ErrNotFound.
func (s *Store) Move(ctx context.Context, domain string) (Move, error) {
	return s.move(ctx, s.db, domain, false)
}

// ActiveMoves names the domains moving.
func (s *Store) ActiveMoves(ctx context.Context) ([]string, error) {
	return s.strings(ctx, s.db, `SELECT domain FROM moves WHERE state IN ('waiting', 'draining') ORDER BY domain`)
}

func (s *Store) saveMove(ctx context.Context, tx *sql.Tx, m Move) error {
	steps, err := json.Marshal(m.Steps)
	if err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, s.q(`INSERT INTO moves (domain, from_pool, to_pool, state, reason, steps, started_at, deadline, drain_until)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (domain) DO UPDATE SET from_pool = excluded.from_pool, to_pool = excluded.to_pool,
		state = excluded.state, reason = excluded.reason, steps = excluded.steps, started_at = excluded.started_at,
		deadline = excluded.deadline, drain_until = excluded.drain_until`),
		m.Domain, m.From, m.To, m.State, m.Reason, string(steps), ms(m.StartedAt), ms(m.Deadline), ms(m.DrainUntil))
	return err
}

func (m *Move) step(now time.Time, step, detail string) {
	m.Steps = append(m.Steps, adminapi.MoveStep{Step: step, At: fromMS(ms(now)), Detail: detail})
}

// StartMove starts moving domain to pool to, target-first: it is placed
// in to on every edge where to has cells and its current revision is
// delivered to those cells beside the source ones. It fails unless every
// target cell applied it and is ready within readyWithin.
func (s *Store) StartMove(ctx context.Context, domain, to string, readyWithin time.Duration, sign Signer) (Move, []EdgeSequence, error) {
	var m Move
	var edges []EdgeSequence
	err := s.tx(ctx, func(tx *sql.Tx) error {
		gen, err := s.next(ctx, tx, "gen")
		if err != nil {
			return err
		}
		d, err := s.domain(ctx, tx, domain, true)
		if err != nil {
			return err
		}
		if d.Deleted {
			return fmt.Errorf("domain %s was deleted: %w", domain, ErrNotFound)
		}
		if d.Pool == to {
			return fmt.Errorf("domain %s is in pool %s already: %w", domain, to, ErrConflict)
		}
		if cur, err := s.move(ctx, tx, domain, true); err == nil && cur.Active() {
			return fmt.Errorf("domain %s is moving to %s already (%s): %w", domain, cur.To, cur.State, ErrConflict)
		} else if err != nil && !errors.Is(err, ErrNotFound) {
			return err
		}
		if n, err := s.count(ctx, tx, `SELECT COUNT(*) FROM placements WHERE domain = ? AND role <> 'active'`, domain); err != nil {
			return err
		} else if n > 0 {
			return fmt.Errorf("domain %s is leaving a cell being unassigned (edge show): %w", domain, ErrConflict)
		}
		p, err := s.pool(ctx, tx, to)
		if err != nil {
			return err
		}
		now := s.Now()
		m = Move{Domain: domain, From: d.Pool, To: to, State: adminapi.MoveWaiting, StartedAt: fromMS(ms(now)), Deadline: fromMS(ms(now.Add(readyWithin)))}
		m.step(now, "started", fmt.Sprintf("from %s to %s, revision %d", d.Pool, to, d.Revision))
		ids, skipped, err := s.placePool(ctx, tx, domain, p, RoleTarget)
		if err != nil {
			return err
		}
		for _, id := range slices.Sorted(maps.Keys(skipped)) {
			m.step(now, "skipped", skipped[id])
		}
		n, err := s.count(ctx, tx, `SELECT COUNT(*) FROM placements WHERE domain = ? AND role = 'target'`, domain)
		if err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("pool %s has no cells on any edge: %w", to, ErrUnavailable)
		}
		m.step(now, "placed", fmt.Sprintf("%d target cell(s) on %d edge(s)", n, len(ids)))
		if err := s.saveMove(ctx, tx, m); err != nil {
			return err
		}
		if edges, err = s.reemit(ctx, tx, gen, domain, nil, sign); err != nil {
			return err
		}
		m.step(now, "delivering", fmt.Sprintf("revision %d to %d edge(s)", d.Revision, len(edges)))
		return s.saveMove(ctx, tx, m)
	})
	if err != nil {
		return Move{}, nil, fmt.Errorf("move %s to %s: %w", domain, to, err)
	}
	return m, edges, nil
}

func (s *Store) count(ctx context.Context, q querier, query string, args ...any) (int, error) {
	var n int
	err := q.QueryRowContext(ctx, s.q(query), args...).Scan(&n)
	return n, err
}

// CancelMove ends a move that has not switched: the target cells let the
// domain go, the source was never touched.
func (s *Store) CancelMove(ctx context.Context, domain string, sign Signer) (Move, error) {
	m, err := s.endMove(ctx, domain, adminapi.MoveWaiting, adminapi.MoveCancelled, "cancelled by the operator", sign)
	if err != nil {
		return Move{}, fmt.Errorf("cancel the move of %s: %w", domain, err)
	}
	return m, nil
}

// endMove fails or cancels a waiting move: the target cells are released
// and the edges told.
func (s *Store) endMove(ctx context.Context, domain, want, state, reason string, sign Signer) (Move, error) {
	var m Move
	err := s.tx(ctx, func(tx *sql.Tx) error {
		gen, err := s.next(ctx, tx, "gen")
		if err != nil {
			return err
		}
		if m, err = s.move(ctx, tx, domain, true); err != nil {
			return err
		}
		if m.State != want {
			return fmt.Errorf("the move to %s is %s, not %s: %w", m.To, m.State, want, ErrConflict)
		}
		ids, err := s.strings(ctx, tx, `SELECT DISTINCT edge_id FROM placements WHERE domain = ? AND role = 'target'`, domain)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM placements WHERE domain = ? AND role = 'target'`), domain); err != nil {
			return err
		}
		m.State, m.Reason = state, reason
		m.step(s.Now(), state, reason)
		if err := s.saveMove(ctx, tx, m); err != nil {
			return err
		}
		_, err = s.reemit(ctx, tx, gen, domain, ids, sign)
		return err
	})
	return m, err
}

// StepMove drives a move one step when it can take one: a waiting move
// switches when every target cell applied the domain's current entry and
// is ready, and fails when one refused it or the deadline passed; a
// draining move finishes when the drain interval passed. It returns the
// move as it is after, and what it still waits for. rebuild makes the
// revision for the target pool that finishing a move publishes.
func (s *Store) StepMove(ctx context.Context, domain string, sign Signer, rebuild Rebuilder) (Move, string, error) {
	m, err := s.Move(ctx, domain)
	if err != nil {
		return Move{}, "", err
	}
	now := s.Now()
	switch m.State {
	case adminapi.MoveWaiting:
		waiting, refused, err := s.targetsReady(ctx, domain, "")
		if err != nil {
			return m, "", err
		}
		switch {
		case refused != "":
			m, err = s.endMove(ctx, domain, adminapi.MoveWaiting, adminapi.MoveFailed, refused, sign)
		case waiting == "":
			m, err = s.switchMove(ctx, domain)
		case !now.Before(m.Deadline):
			m, err = s.endMove(ctx, domain, adminapi.MoveWaiting, adminapi.MoveFailed, "not ready in time: "+waiting, sign)
		default:
			return m, waiting, nil
		}
		if errors.Is(err, ErrConflict) { // another replica took the step
			m, err = s.Move(ctx, domain)
		}
		return m, "", err
	case adminapi.MoveDraining:
		if now.Before(m.DrainUntil) {
			return m, "the drain interval", nil
		}
		m, err = s.finishMove(ctx, domain, sign, rebuild)
		if errors.Is(err, ErrConflict) {
			m, err = s.Move(ctx, domain)
		}
		return m, "", err
	}
	return m, "", nil
}

// targetsReady says what a domain's target cells (on edgeID only, unless
// it is empty) still wait for (empty: nothing), or why they failed (a
// refused acknowledgement).
func (s *Store) targetsReady(ctx context.Context, domain, edgeID string) (waiting, refused string, err error) {
	ps, err := s.placements(ctx, s.db, domain)
	if err != nil {
		return "", "", err
	}
	type edgeState struct {
		from   int64
		status edgeapi.Summary
		ok     bool
	}
	edges := map[string]*edgeState{}
	for _, p := range ps {
		if p.Role != RoleTarget || (edgeID != "" && p.EdgeID != edgeID) {
			continue
		}
		es, seen := edges[p.EdgeID]
		if !seen {
			es = &edgeState{}
			edges[p.EdgeID] = es
			err := s.db.QueryRowContext(ctx, s.q(`SELECT from_seq FROM manifest_entries WHERE edge_id = ? AND domain = ? AND to_seq = 0`), p.EdgeID, domain).Scan(&es.from)
			if errors.Is(err, sql.ErrNoRows) {
				return fmt.Sprintf("edge %s has no entry for the domain", p.EdgeID), "", nil
			}
			if err != nil {
				return "", "", err
			}
			var seq int64
			var reason string
			err = s.db.QueryRowContext(ctx, s.q(`SELECT sequence, reason FROM acks WHERE edge_id = ? AND sequence >= ? AND status = ? ORDER BY sequence LIMIT 1`),
				p.EdgeID, es.from, manifest.AckRefused).Scan(&seq, &reason)
			if err == nil {
				return "", fmt.Sprintf("edge %s refused manifest sequence %d: %s", p.EdgeID, seq, reason), nil
			}
			if !errors.Is(err, sql.ErrNoRows) {
				return "", "", err
			}
			var status string
			var active int64
			if err := s.db.QueryRowContext(ctx, s.q(`SELECT active_sequence, status FROM edges WHERE id = ?`), p.EdgeID).Scan(&active, &status); err != nil {
				return "", "", err
			}
			es.ok = active >= es.from
			if status != "" {
				json.Unmarshal([]byte(status), &es.status)
			}
		}
		if waiting != "" {
			continue
		}
		if !es.ok {
			waiting = fmt.Sprintf("edge %s to apply sequence %d", p.EdgeID, es.from)
			continue
		}
		var cells string
		err := s.db.QueryRowContext(ctx, s.q(`SELECT cells FROM acks WHERE edge_id = ? AND sequence >= ? AND status = ? ORDER BY sequence DESC LIMIT 1`),
			p.EdgeID, es.from, manifest.AckPartial).Scan(&cells)
		if err == nil && slices.Contains(strings.Split(cells, ","), p.Cell) {
			waiting = fmt.Sprintf("%s of edge %s to load sequence %d", p.Cell, p.EdgeID, es.from)
			continue
		}
		state := "unreported"
		for _, c := range es.status.Slots {
			if c.Name == p.Cell {
				state = c.State
				if c.State == "ready" && !c.Drained && c.Sequence >= es.from {
					state = ""
				}
			}
		}
		if state != "" {
			waiting = fmt.Sprintf("%s of edge %s to report ready at sequence %d (%s)", p.Cell, p.EdgeID, es.from, state)
		}
	}
	return waiting, "", nil
}

// switchMove switches routing to the target: the domain's active pool is
// the target's from now on, the source cells are leaving and keep serving
// for the source pool's drain interval. Nothing changes on the edges.
func (s *Store) switchMove(ctx context.Context, domain string) (Move, error) {
	var m Move
	err := s.tx(ctx, func(tx *sql.Tx) error {
		if _, err := s.next(ctx, tx, "gen"); err != nil {
			return err
		}
		var err error
		if m, err = s.move(ctx, tx, domain, true); err != nil {
			return err
		}
		if m.State != adminapi.MoveWaiting {
			return fmt.Errorf("the move is %s: %w", m.State, ErrConflict)
		}
		from, err := s.pool(ctx, tx, m.From)
		if err != nil {
			return err
		}
		for _, q := range []string{
			`UPDATE placements SET role = 'leaving' WHERE domain = ? AND role = 'active'`,
			`UPDATE placements SET role = 'active' WHERE domain = ? AND role = 'target'`,
		} {
			if _, err := tx.ExecContext(ctx, s.q(q), domain); err != nil {
				return err
			}
		}
		if _, err := tx.ExecContext(ctx, s.q(`UPDATE domains SET pool = ? WHERE name = ?`), m.To, domain); err != nil {
			return err
		}
		now := s.Now()
		m.State, m.DrainUntil = adminapi.MoveDraining, fromMS(ms(now.Add(from.Drain)))
		m.step(now, "applied", "every target cell applied the revision and reports ready")
		m.step(now, "switched", "routing publishes the target cells; the source drains for "+from.Drain.String())
		return s.saveMove(ctx, tx, m)
	})
	return m, err
}

// Rebuilder makes a domain's artifact for another pool at a new revision
// from its current artifact: the same configuration, the pool and revision
// it names changed.
type Rebuilder func(artifact []byte, pool string, revision int64) ([]byte, error)

// finishMove removes the domain from the source cells once drained and,
// unless a revision was published for the target pool during the drain,
// publishes the current configuration as a new revision built for the
// target pool (rebuild), in the same sequence: the entry the edges get
// names the target pool and so does its artifact.
func (s *Store) finishMove(ctx context.Context, domain string, sign Signer, rebuild Rebuilder) (Move, error) {
	var m Move
	err := s.tx(ctx, func(tx *sql.Tx) error {
		gen, err := s.next(ctx, tx, "gen")
		if err != nil {
			return err
		}
		if m, err = s.move(ctx, tx, domain, true); err != nil {
			return err
		}
		if m.State != adminapi.MoveDraining {
			return fmt.Errorf("the move is %s: %w", m.State, ErrConflict)
		}
		ids, err := s.strings(ctx, tx, `SELECT DISTINCT edge_id FROM placements WHERE domain = ? AND role = 'leaving'`, domain)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM placements WHERE domain = ? AND role = 'leaving'`), domain); err != nil {
			return err
		}
		rev, err := s.retarget(ctx, tx, domain, m.To, rebuild)
		if err != nil {
			return fmt.Errorf("publish %s for %s: %w", domain, m.To, err)
		}
		m.State = adminapi.MoveDone
		detail := "removed from the source cells"
		if rev > 0 {
			detail += fmt.Sprintf("; revision %d published for %s", rev, m.To)
		}
		m.step(s.Now(), "drained", detail)
		if err := s.saveMove(ctx, tx, m); err != nil {
			return err
		}
		_, err = s.reemit(ctx, tx, gen, domain, ids, sign)
		return err
	})
	return m, err
}

// retarget publishes domain's current configuration as a new revision
// built for pool, unless its current revision is pool's already (0).
func (s *Store) retarget(ctx context.Context, tx *sql.Tx, domain, pool string, rebuild Rebuilder) (int64, error) {
	lock := ""
	if s.dialect == Postgres {
		lock = " FOR UPDATE OF d"
	}
	var cur string
	var top int64
	var data []byte
	err := tx.QueryRowContext(ctx, s.q(`SELECT r.pool, d.top_revision, a.data FROM domains d
		JOIN domain_revisions r ON r.domain = d.name AND r.revision = d.revision
		JOIN artifacts a ON a.sha256 = d.sha256 WHERE d.name = ?`+lock), domain).Scan(&cur, &top, &data)
	if err != nil {
		return 0, err
	}
	if cur == pool {
		return 0, nil
	}
	if rebuild == nil {
		return 0, errors.New("no rebuilder")
	}
	artifact, err := rebuild(data, pool, top+1)
	if err != nil {
		return 0, err
	}
	sum := sha256.Sum256(artifact)
	d := Domain{Name: domain, Pool: pool, Revision: top + 1, SHA256: hex.EncodeToString(sum[:]), Size: int64(len(artifact)), UpdatedAt: fromMS(ms(s.Now()))}
	if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO artifacts (sha256, data, created_at) VALUES (?, ?, ?) ON CONFLICT (sha256) DO NOTHING`),
		d.SHA256, artifact, ms(d.UpdatedAt)); err != nil {
		return 0, fmt.Errorf("store artifact: %w", err)
	}
	if _, err := tx.ExecContext(ctx, s.q(`UPDATE domains SET pool = ?, revision = ?, top_revision = ?, sha256 = ?, size = ?, updated_at = ? WHERE name = ?`),
		d.Pool, d.Revision, d.Revision, d.SHA256, d.Size, ms(d.UpdatedAt), domain); err != nil {
		return 0, fmt.Errorf("store domain: %w", err)
	}
	cert, fp := revisionTLS(artifact)
	if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO domain_revisions (domain, revision, pool, sha256, size, created_at, certificate, fingerprint) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`),
		domain, d.Revision, pool, d.SHA256, d.Size, ms(d.UpdatedAt), cert, fp); err != nil {
		return 0, fmt.Errorf("store revision: %w", err)
	}
	return d.Revision, nil
}

// WaitingFor says what a waiting move waits for now: empty when nothing
// (its next step switches it) or when it is not waiting.
func (s *Store) WaitingFor(ctx context.Context, m Move) (string, error) {
	switch m.State {
	case adminapi.MoveWaiting:
		waiting, refused, err := s.targetsReady(ctx, m.Domain, "")
		if refused != "" {
			return refused, err
		}
		return waiting, err
	case adminapi.MoveDraining:
		return "the drain interval, until " + m.DrainUntil.Format(time.RFC3339), nil
	}
	return "", nil
}
