package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"cellvisor/internal/backoff"
	"cellvisor/manifest"
)

// ErrStopped is a write queued to a Batcher that stopped before committing
// it.
var ErrStopped = errors.New("the database writer stopped")

// Batcher is the one writer of a replica's frequent small writes (acks,
// status reports with their egress part and gateways): each request queues
// its write and is answered when the transaction holding it has committed,
// so that an answered write is durable. Writes queued while a batch
// commits form the next one (group commit): no write waits for a timer,
// and under load one commit carries many. Each write runs under its own
// savepoint, so that one refused (an edge deleted meanwhile) fails alone.
type Batcher struct {
	s    *Store
	max  int
	ch   chan *write
	done chan struct{}
}

// write is one queued write: the Store method it stands for (counted by
// Hooks.Wrote), the edge it writes (a batch takes edges in id order, as
// Touch does), its statements, and its outcome once done is closed.
type write struct {
	kind string
	edge string
	f    func(ctx context.Context, tx *sql.Tx) error
	err  error
	done chan struct{}
}

// NewBatcher returns a Batcher of at most max writes a transaction (256
// for 0 or less). Run it; its writes wait until it runs.
func (s *Store) NewBatcher(max int) *Batcher {
	if max <= 0 {
		max = 256
	}
	return &Batcher{s: s, max: max, ch: make(chan *write, 4*max), done: make(chan struct{})}
}

// Run commits queued writes until ctx ends; writes still queued then fail
// with ErrStopped.
func (b *Batcher) Run(ctx context.Context) {
	defer close(b.done)
	for {
		var first *write
		if ctx.Err() == nil {
			select {
			case <-ctx.Done():
			case first = <-b.ch:
			}
		}
		if first == nil { // stopped
			for {
				select {
				case w := <-b.ch:
					w.err = ErrStopped
					close(w.done)
				default:
					return
				}
			}
		}
		batch := []*write{first}
	more:
		for len(batch) < b.max {
			select {
			case w := <-b.ch:
				batch = append(batch, w)
			default:
				break more
			}
		}
		b.commit(ctx, batch)
	}
}

// Ack is Store.Ack, committed with the batch that holds it.
func (b *Batcher) Ack(ctx context.Context, edgeID string, a manifest.Ack) error {
	return b.do(ctx, &write{kind: "Ack", edge: edgeID, f: func(ctx context.Context, tx *sql.Tx) error {
		return b.s.ack(ctx, tx, edgeID, a)
	}})
}

// PutStatus is Store.PutStatus, committed with the batch that holds it.
func (b *Batcher) PutStatus(ctx context.Context, id string, r Report) error {
	err := b.do(ctx, &write{kind: "PutStatus", edge: id, f: func(ctx context.Context, tx *sql.Tx) error {
		return b.s.putStatus(ctx, tx, id, r)
	}})
	if err != nil {
		return fmt.Errorf("status of edge %s: %w", id, err)
	}
	return nil
}

// do queues w and waits until the batch holding it has committed (or
// failed), ctx ends, or the Batcher stops.
func (b *Batcher) do(ctx context.Context, w *write) error {
	w.done = make(chan struct{})
	select {
	case b.ch <- w:
	case <-b.done:
		return ErrStopped
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-w.done:
		return w.err
	case <-ctx.Done():
		return ctx.Err()
	case <-b.done:
		select {
		case <-w.done:
			return w.err
		default:
			return ErrStopped
		}
	}
}

// commit runs a batch in one transaction, each write under a savepoint,
// and runs it again when the database could not serialize it (as
// retryTx), for at most a minute: a batch begun is finished even when the
// writer is stopping.
func (b *Batcher) commit(ctx context.Context, batch []*write) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	slices.SortStableFunc(batch, func(x, y *write) int { return strings.Compare(x.edge, y.edge) })
	s := b.s
	bo := &backoff.Backoff{Initial: 5 * time.Millisecond, Max: 250 * time.Millisecond}
	var err error
	for {
		if err = s.batchTx(ctx, batch); err == nil || !Retryable(err) || ctx.Err() != nil {
			break
		}
		if s.Hooks.Retried != nil {
			s.Hooks.Retried(err)
		}
		if bo.Wait(ctx) != nil {
			break
		}
	}
	for _, w := range batch {
		if err != nil {
			w.err = fmt.Errorf("commit a batch of %d writes: %w", len(batch), err)
		} else if w.err == nil && s.Hooks.Wrote != nil {
			s.Hooks.Wrote(w.kind)
		}
		close(w.done)
	}
	if s.Hooks.Batch != nil {
		s.Hooks.Batch(len(batch))
	}
}

// batchTx runs every write of batch in one transaction, each under a
// savepoint rolled back alone when the write fails; a failure the
// database cannot serialize, or of the savepoints themselves, fails the
// transaction.
func (s *Store) batchTx(ctx context.Context, batch []*write) error {
	unlock, err := s.writeLock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	for _, w := range batch {
		w.err = nil
		if _, err := tx.ExecContext(ctx, `SAVEPOINT w`); err != nil {
			return err
		}
		if err := w.f(ctx, tx); err != nil {
			if Retryable(err) {
				return err
			}
			if _, rerr := tx.ExecContext(ctx, `ROLLBACK TO SAVEPOINT w`); rerr != nil {
				return errors.Join(err, rerr)
			}
			w.err = err
		}
		if _, err := tx.ExecContext(ctx, `RELEASE SAVEPOINT w`); err != nil {
			return err
		}
	}
	return tx.Commit()
}
