package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Task is a control task for one cell of an edge.
type Task struct {
	ID        int64
	EdgeID    string
	Cell      string
	Action    string
	State     string
	Result    string
	CreatedAt time.Time
	DoneAt    time.Time
}

const taskColumns = `id, edge_id, cell, action, state, result, created_at, done_at`

func scanTask(r scanner) (Task, error) {
	var t Task
	var created, done int64
	err := r.Scan(&t.ID, &t.EdgeID, &t.Cell, &t.Action, &t.State, &t.Result, &created, &done)
	t.CreatedAt, t.DoneAt = fromMS(created), fromMS(done)
	return t, err
}

// CreateTask queues a pending task for an edge's cell.
func (s *Store) CreateTask(ctx context.Context, edgeID, cell, action string) (Task, error) {
	t := Task{EdgeID: edgeID, Cell: cell, Action: action, State: "pending", CreatedAt: fromMS(ms(s.Now()))}
	err := s.tx(ctx, func(tx *sql.Tx) error {
		var err error
		if t.ID, err = s.next(ctx, tx, "task"); err != nil {
			return err
		}
		gen, err := s.next(ctx, tx, "gen")
		if err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, s.q(`UPDATE edges SET gen = ? WHERE id = ?`), gen, edgeID)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return fmt.Errorf("edge %s: %w", edgeID, ErrNotFound)
		}
		_, err = tx.ExecContext(ctx, s.q(`INSERT INTO tasks (`+taskColumns+`) VALUES (?, ?, ?, ?, ?, '', ?, 0)`),
			t.ID, edgeID, cell, action, t.State, ms(t.CreatedAt))
		return err
	})
	if err != nil {
		return Task{}, fmt.Errorf("create %s task for %s of edge %s: %w", action, cell, edgeID, err)
	}
	return t, nil
}

// Tasks returns an edge's tasks, oldest first: the oldest limit pending
// ones, or the newest limit of all.
func (s *Store) Tasks(ctx context.Context, edgeID string, pendingOnly bool, limit int) ([]Task, error) {
	query := `SELECT ` + taskColumns + ` FROM (SELECT ` + taskColumns + ` FROM tasks WHERE edge_id = ?`
	if pendingOnly {
		query += ` AND state = 'pending'`
	}
	if pendingOnly {
		query += ` ORDER BY id LIMIT ?) t ORDER BY id` // the oldest first: they run in order
	} else {
		query += ` ORDER BY id DESC LIMIT ?) t ORDER BY id`
	}
	rows, err := s.db.QueryContext(ctx, s.q(query), edgeID, limit)
	if err != nil {
		return nil, fmt.Errorf("tasks of edge %s: %w", edgeID, err)
	}
	defer rows.Close()
	var out []Task
	for rows.Next() {
		t, err := scanTask(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// FinishTask records what became of an edge's pending task. Finishing it
// again with the same state is a no-op (an agent's retried ack);
// ErrNotFound for another edge's task, ErrConflict for a task finished
// otherwise.
func (s *Store) FinishTask(ctx context.Context, edgeID string, id int64, state, result string) (Task, error) {
	var t Task
	err := s.tx(ctx, func(tx *sql.Tx) error {
		var err error
		t, err = scanTask(tx.QueryRowContext(ctx, s.q(`SELECT `+taskColumns+` FROM tasks WHERE id = ? AND edge_id = ?`), id, edgeID))
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("task %d: %w", id, ErrNotFound)
		}
		if err != nil {
			return err
		}
		if t.State != "pending" {
			if t.State == state {
				return nil
			}
			return fmt.Errorf("task %d is %s already: %w", id, t.State, ErrConflict)
		}
		gen, err := s.next(ctx, tx, "gen")
		if err != nil {
			return err
		}
		t.State, t.Result, t.DoneAt = state, result, fromMS(ms(s.Now()))
		res, err := tx.ExecContext(ctx, s.q(`UPDATE tasks SET state = ?, result = ?, done_at = ? WHERE id = ? AND state = 'pending'`), state, result, ms(t.DoneAt), id)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n != 1 {
			// Finished by a concurrent ack (PostgreSQL read the row before
			// that one committed).
			return fmt.Errorf("task %d finished concurrently: %w", id, ErrConflict)
		}
		_, err = tx.ExecContext(ctx, s.q(`UPDATE edges SET gen = ? WHERE id = ?`), gen, edgeID)
		return err
	})
	if err != nil {
		return Task{}, fmt.Errorf("finish task %d of edge %s: %w", id, edgeID, err)
	}
	return t, nil
}
