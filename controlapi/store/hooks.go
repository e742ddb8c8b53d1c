package store

import (
	"context"
	"database/sql"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"time"
)

// Hooks tell an observer (controlapi's metrics) of the store's writes and
// placements. Set them before the store is used; nil hooks are skipped.
type Hooks struct {
	// Wrote is called once per committed write: a transaction, or a single
	// statement outside one. kind is the exported Store method that wrote
	// (PutStatus, Touch, Ack, PublishDomain, …): a bounded set.
	Wrote func(kind string)
	// Placed is called with the time one placement of a domain on one
	// edge's pool took (placement.Place and its reads of the pool's cells
	// and placements).
	Placed func(d time.Duration)
	// Retried is called when a write the database could not serialize
	// (busy, locked, a serialization failure, a deadlock) is run again:
	// err is why.
	Retried func(err error)
	// Batch is called with the number of writes each Batcher transaction
	// carried, once it is over.
	Batch func(n int)
}

// kinds caches the write kind of each call stack (a helper called by
// several methods has one per caller).
var kinds sync.Map // [8]uintptr → string

// wrote counts a committed write under the name of the exported Store
// method it was made for: the first one up the stack from s.tx or s.exec,
// so that every write, those of methods added later included, is counted
// without naming each one by hand.
func (s *Store) wrote() {
	if s.Hooks.Wrote == nil {
		return
	}
	var pcs [8]uintptr
	n := runtime.Callers(3, pcs[:])
	if n == 0 {
		s.Hooks.Wrote("unknown")
		return
	}
	if k, ok := kinds.Load(pcs); ok {
		s.Hooks.Wrote(k.(string))
		return
	}
	kind := "unknown"
	frames := runtime.CallersFrames(pcs[:n])
	for {
		f, more := frames.Next()
		if k, ok := storeMethod(f.Function); ok {
			kind = k
			break
		}
		if !more {
			break
		}
	}
	kinds.Store(pcs, kind)
	s.Hooks.Wrote(kind)
}

// storeMethod returns Method of "cellvisor/controlapi/store.(*Store).Method"
// (or of one of its closures) when it is exported.
func storeMethod(fn string) (string, bool) {
	_, m, ok := strings.Cut(fn, "store.(*Store).")
	if !ok {
		return "", false
	}
	m, _, _ = strings.Cut(m, ".")
	if m == "" || m[0] < 'A' || m[0] > 'Z' {
		return "", false
	}
	return m, true
}

// execLocked runs one write statement outside a transaction under the
// write lock (writeLock); query is in the database's placeholders.
func (s *Store) execLocked(ctx context.Context, query string, args ...any) (sql.Result, error) {
	unlock, err := s.writeLock(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	return s.db.ExecContext(ctx, query, args...)
}

// exec runs one write statement outside a transaction and counts it.
func (s *Store) exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := s.execLocked(ctx, s.q(query), args...)
	if err != nil {
		return 0, err
	}
	s.wrote()
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("rows affected: %w", err)
	}
	return n, nil
}

// placed reports a placement's duration.
func (s *Store) placed(start time.Time) {
	if s.Hooks.Placed != nil {
		s.Hooks.Placed(time.Since(start))
	}
}
