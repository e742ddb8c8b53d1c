package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"cellvisor/controlapi/adminapi"
	"cellvisor/manifest"
)

// The fleet page's queries: read-only and bounded, so that a page over
// 10,000 edges costs what one page of them does.

// EdgeFilter selects a page of edges by name.
type EdgeFilter struct {
	// After is the last name of the previous page; empty for the first.
	After string
	// Limit bounds the page; it is clamped to 1–1000.
	Limit int
	// SilentBefore, when not zero, keeps only enrolled edges last seen
	// before it (never seen counts as before).
	SilentBefore time.Time
}

// EdgesPage returns a page of edges by name.
func (s *Store) EdgesPage(ctx context.Context, f EdgeFilter) ([]Edge, error) {
	limit := min(max(f.Limit, 1), 1000)
	query, args := `SELECT `+edgeColumns+` FROM edges WHERE name > ?`, []any{f.After}
	if !f.SilentBefore.IsZero() {
		query += ` AND cert_serial <> '' AND last_seen < ?`
		args = append(args, ms(f.SilentBefore))
	}
	args = append(args, limit)
	rows, err := s.db.QueryContext(ctx, s.q(query+` ORDER BY name LIMIT ?`), args...)
	if err != nil {
		return nil, fmt.Errorf("edges page: %w", err)
	}
	defer rows.Close()
	var out []Edge
	for rows.Next() {
		e, err := scanEdge(rows)
		if err != nil {
			return nil, fmt.Errorf("edges page: %w", err)
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// CountEdges counts the fleet's edges.
func (s *Store) CountEdges(ctx context.Context) (int, error) {
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM edges`).Scan(&n); err != nil {
		return 0, fmt.Errorf("count edges: %w", err)
	}
	return n, nil
}

// SilentEdges returns the ids of the enrolled edges last seen before a
// time as the store has it (never seen counts as before). A replica's
// last-seen times reach the store every touch interval, so the caller
// checks its own newer ones.
func (s *Store) SilentEdges(ctx context.Context, before time.Time) ([]string, error) {
	ids, err := s.strings(ctx, s.db, `SELECT id FROM edges WHERE cert_serial <> '' AND last_seen < ? ORDER BY id`, ms(before))
	if err != nil {
		return nil, fmt.Errorf("silent edges: %w", err)
	}
	return ids, nil
}

// EdgeAck is an acknowledgement with its edge's name.
type EdgeAck struct {
	EdgeID, EdgeName string
	manifest.Ack
	ReceivedAt time.Time
}

// RecentAcks returns the newest acknowledgements of every edge with this
// status, newest received first.
func (s *Store) RecentAcks(ctx context.Context, status string, limit int) ([]EdgeAck, error) {
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT a.edge_id, e.name, a.sequence, a.status, a.reason, a.cells, a.at, a.received_at
		FROM acks a JOIN edges e ON e.id = a.edge_id WHERE a.status = ? ORDER BY a.received_at DESC, a.edge_id, a.sequence DESC LIMIT ?`), status, limit)
	if err != nil {
		return nil, fmt.Errorf("recent acks: %w", err)
	}
	defer rows.Close()
	var out []EdgeAck
	for rows.Next() {
		var a EdgeAck
		var cells string
		var at, received int64
		if err := rows.Scan(&a.EdgeID, &a.EdgeName, &a.Sequence, &a.Status, &a.Reason, &cells, &at, &received); err != nil {
			return nil, fmt.Errorf("recent acks: %w", err)
		}
		a.At, a.ReceivedAt = fromMS(at), fromMS(received)
		if cells != "" {
			a.Cells = strings.Split(cells, ",")
		}
		out = append(out, a)
	}
	return out, rows.Err()
}

// FailingMoves returns the moves that failed and those still waiting for
// their target past their deadline, newest first.
func (s *Store) FailingMoves(ctx context.Context, limit int) ([]Move, error) {
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT domain, from_pool, to_pool, state, reason, steps, started_at, deadline, drain_until FROM moves
		WHERE state = ? OR (state = ? AND deadline < ?) ORDER BY started_at DESC, domain LIMIT ?`), adminapi.MoveFailed, adminapi.MoveWaiting, ms(s.Now()), limit)
	if err != nil {
		return nil, fmt.Errorf("failing moves: %w", err)
	}
	defer rows.Close()
	var out []Move
	for rows.Next() {
		var m Move
		var steps string
		var started, deadline, drain int64
		if err := rows.Scan(&m.Domain, &m.From, &m.To, &m.State, &m.Reason, &steps, &started, &deadline, &drain); err != nil {
			return nil, fmt.Errorf("failing moves: %w", err)
		}
		m.StartedAt, m.Deadline, m.DrainUntil = fromMS(started), fromMS(deadline), fromMS(drain)
		if err := json.Unmarshal([]byte(steps), &m.Steps); err != nil {
			return nil, fmt.Errorf("move of %s: steps: %w", m.Domain, err)
		}
		out = append(out, m)
	}
	return out, rows.Err()
}
