// Package store is the control API's database: edges and their identity,
// pools and cell assignments, domains and artifacts, each edge's manifest
// sequences, acknowledgements, status reports and control tasks. One schema
// and one implementation over database/sql serve both an embedded SQLite
// file (modernc.org/sqlite, no cgo) and PostgreSQL (pgx), so that several
// control replicas can share one database. It stores what it is given:
// secrets arrive hashed (tokens) or sealed (keys). Only controlapi and
// its egress lease service (controlapi/lease) import it; its move states
// are adminapi's.
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"
	"modernc.org/sqlite"               // registers "sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"cellvisor/internal/backoff"
)

// Errors.
var (
	ErrNotFound = errors.New("not found")
	ErrConflict = errors.New("conflict")
)

// Dialects.
const (
	SQLite   = "sqlite"
	Postgres = "postgres"
)

// keepSequences is how many sequences of an edge's manifest stay readable,
// the current one included, so that an agent paging through one while a
// newer one is published can finish its walk.
const keepSequences = 16

// Store is an open control database.
type Store struct {
	db      *sql.DB
	dialect string
	// writing is held (a token in it) by the one SQLite write of this
	// process (writeLock): others wait here, not in SQLite's busy handler,
	// which sleeps up to 100 ms between looks while holding one of the
	// pool's connections (with eight writers waiting there, every read
	// waited for a connection: p50s of 200-400 ms at 2,000 edges with the
	// CPU idle). nil on PostgreSQL, whose rows lock on their own.
	writing chan struct{}
	// writeWaiters counts the writes waiting in writeLock.
	writeWaiters atomic.Int64
	// Hooks observe writes and placements (metrics); none when zero.
	Hooks Hooks
	// Now is the clock; time.Now unless testing.
	Now func() time.Time
	// SealKey seals certificates' keys into the entries of the domains
	// that carry one; nil gives no entry a key.
	SealKey KeySealer
}

// Open opens the database named by dsn, a postgres:// or postgresql:// URL
// or else a SQLite file path, and applies the migrations it lacks.
func Open(ctx context.Context, dsn string) (*Store, error) {
	s := &Store{Now: time.Now}
	var err error
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		s.dialect = Postgres
		s.db, err = sql.Open("pgx", dsn)
		if err == nil {
			s.db.SetMaxOpenConns(32)
			s.db.SetMaxIdleConns(32)
		}
	} else {
		s.dialect = SQLite
		s.writing = make(chan struct{}, 1)
		if err := createPrivate(dsn); err != nil {
			return nil, fmt.Errorf("open %s database: %w", s.dialect, err)
		}
		// WAL lets readers run beside the writer; immediate transactions take
		// the write lock up front instead of failing on an upgrade.
		s.db, err = sql.Open("sqlite", "file:"+dsn+"?_txlock=immediate&_pragma=busy_timeout("+strconv.FormatInt(sqliteBusyTimeout.Milliseconds(), 10)+")&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_pragma=foreign_keys(1)")
		if err == nil {
			s.db.SetMaxOpenConns(8)
			s.db.SetMaxIdleConns(8)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("open %s database: %w", s.dialect, err)
	}
	if err := s.db.PingContext(ctx); err != nil {
		s.db.Close()
		return nil, fmt.Errorf("open %s database: %w", s.dialect, err)
	}
	if err := s.migrate(ctx); err != nil {
		s.db.Close()
		return nil, err
	}
	return s, nil
}

// createPrivate creates the SQLite file, or tightens an existing one, to
// mode 0600 before SQLite opens it: it holds token hashes, identities and
// every artifact, and SQLite gives its -wal and -shm files the mode of the
// database file. A link is refused: the file is the operator's data
// directory's own.
func createPrivate(path string) error {
	if path == ":memory:" || strings.HasPrefix(path, "file:") {
		return nil
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", path)
	}
	if fi.Mode().Perm() != 0o600 {
		if err := f.Chmod(0o600); err != nil {
			return err
		}
	}
	for _, side := range []string{"-wal", "-shm"} {
		if err := os.Chmod(path+side, 0o600); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

// Dialect is SQLite or Postgres.
func (s *Store) Dialect() string { return s.dialect }

// q rewrites ? placeholders for the dialect.
func (s *Store) q(query string) string {
	if s.dialect != Postgres {
		return query
	}
	var b strings.Builder
	n := 0
	for i := 0; i < len(query); i++ {
		if query[i] == '?' {
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			continue
		}
		b.WriteByte(query[i])
	}
	return b.String()
}

func (s *Store) ddl(stmt string) string {
	blob, bigint := "BLOB", "INTEGER"
	if s.dialect == Postgres {
		blob, bigint = "BYTEA", "BIGINT"
	}
	return strings.NewReplacer("{{blob}}", blob, "{{bigint}}", bigint, "{{now_ms}}", strconv.FormatInt(ms(s.Now()), 10)).Replace(stmt)
}

// writeLock waits, as long as ctx lasts, until this process's SQLite
// writes leave room for one more (see writing), and returns its release;
// on PostgreSQL it returns at once.
func (s *Store) writeLock(ctx context.Context) (func(), error) {
	if s.writing == nil {
		return func() {}, nil
	}
	select {
	case s.writing <- struct{}{}:
		return func() { <-s.writing }, nil
	default:
	}
	s.writeWaiters.Add(1)
	defer s.writeWaiters.Add(-1)
	select {
	case s.writing <- struct{}{}:
		return func() { <-s.writing }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// tx runs f in a transaction, committing when it returns nil.
func (s *Store) tx(ctx context.Context, f func(*sql.Tx) error) error {
	unlock, err := s.writeLock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := f(tx); err != nil {
		tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	s.wrote()
	return nil
}

// sqliteBusyTimeout is how long SQLite itself waits for the write lock
// before a statement fails with SQLITE_BUSY (retryTx then waits on).
var sqliteBusyTimeout = 10 * time.Second

// retryTx runs f in a transaction like tx, and runs it again, after a
// short jittered backoff, for as long as ctx lasts, when the database
// answered that it could not serialize it: SQLite busy or locked (another
// writer held the lock past the busy timeout), a PostgreSQL serialization
// failure or deadlock (the transaction was rolled back and may simply be
// retried). f must be safe to run again: it must reset what it hands out
// at its start. ctx's end stops the waiting with the last error.
func (s *Store) retryTx(ctx context.Context, f func(*sql.Tx) error) error {
	b := &backoff.Backoff{Initial: 5 * time.Millisecond, Max: 250 * time.Millisecond}
	for {
		err := s.tx(ctx, f)
		if err == nil || !Retryable(err) || ctx.Err() != nil {
			return err
		}
		if s.Hooks.Retried != nil {
			s.Hooks.Retried(err)
		}
		if b.Wait(ctx) != nil {
			return err
		}
	}
}

// Retryable reports an error by which the database refused to serialize a
// transaction, which may simply run again: SQLite busy or locked, a
// PostgreSQL serialization failure (40001) or deadlock (40P01).
func Retryable(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code == "40001" || pe.Code == "40P01"
	}
	var se *sqlite.Error
	if errors.As(err, &se) {
		code := se.Code() & 0xff // the primary code of an extended one
		return code == sqlite3.SQLITE_BUSY || code == sqlite3.SQLITE_LOCKED
	}
	return false
}

// migrate applies the migrations the database lacks. On PostgreSQL an
// advisory lock keeps replicas starting together from racing.
func (s *Store) migrate(ctx context.Context) error {
	err := s.tx(ctx, func(tx *sql.Tx) error {
		if err := s.migrationLock(ctx, tx); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, s.ddl(`CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at {{bigint}} NOT NULL)`))
		return err
	})
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	for i, m := range migrations {
		version := i + 1
		err := s.tx(ctx, func(tx *sql.Tx) error {
			if err := s.migrationLock(ctx, tx); err != nil {
				return err
			}
			var n int
			if err := tx.QueryRowContext(ctx, s.q(`SELECT COUNT(*) FROM schema_migrations WHERE version = ?`), version).Scan(&n); err != nil {
				return err
			}
			if n > 0 {
				return nil
			}
			for _, stmt := range strings.Split(s.ddl(m), ";\n") {
				if strings.TrimSpace(stmt) == "" {
					continue
				}
				if _, err := tx.ExecContext(ctx, stmt); err != nil {
					return fmt.Errorf("%w\n%s", err, stmt)
				}
			}
			_, err := tx.ExecContext(ctx, s.q(`INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)`), version, ms(s.Now()))
			return err
		})
		if err != nil {
			return fmt.Errorf("migrate to schema version %d: %w", version, err)
		}
	}
	return s.tx(ctx, func(tx *sql.Tx) error {
		for _, c := range []string{"gen", "task"} {
			if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO counters (name, value) VALUES (?, 0) ON CONFLICT (name) DO NOTHING`), c); err != nil {
				return fmt.Errorf("seed counters: %w", err)
			}
		}
		for _, name := range []string{"shared-default", "quarantine-default"} {
			class, _, _ := strings.Cut(name, "-")
			p := DefaultPool(name, class)
			// A pool seeded before pools had settings (schema 5) has them
			// all zero: it gets the shipped defaults once.
			if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO pools (name, class, created_at, replicas, bound, min_ready, drain_ms, max_conns, rate, burst)
				VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET bound = excluded.bound, min_ready = excluded.min_ready,
				drain_ms = excluded.drain_ms, max_conns = excluded.max_conns, rate = excluded.rate, burst = excluded.burst
				WHERE pools.bound = 0 AND pools.drain_ms = 0 AND pools.max_conns = 0 AND pools.rate = 0`),
				name, class, ms(s.Now()), p.Replicas, p.Bound, p.MinReady, p.Drain.Milliseconds(), p.MaxConns, p.Rate, p.Burst); err != nil {
				return fmt.Errorf("seed pools: %w", err)
			}
		}
		return nil
	})
}

// migrationLock serializes replicas migrating one PostgreSQL database, for
// the rest of tx (SQLite's immediate transactions already are).
func (s *Store) migrationLock(ctx context.Context, tx *sql.Tx) error {
	if s.dialect != Postgres {
		return nil
	}
	_, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(7204331)`)
	return err
}

// SchemaVersion is the newest migration applied.
func (s *Store) SchemaVersion(ctx context.Context) (int, error) {
	var v sql.NullInt64
	err := s.db.QueryRowContext(ctx, `SELECT MAX(version) FROM schema_migrations`).Scan(&v)
	return int(v.Int64), err
}

// next allocates the next value of a counter inside tx.
func (s *Store) next(ctx context.Context, tx *sql.Tx, counter string) (int64, error) {
	var v int64
	err := tx.QueryRowContext(ctx, s.q(`UPDATE counters SET value = value + 1 WHERE name = ? RETURNING value`), counter).Scan(&v)
	if err != nil {
		return 0, fmt.Errorf("counter %s: %w", counter, err)
	}
	return v, nil
}

func ms(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func fromMS(v int64) time.Time {
	if v == 0 {
		return time.Time{}
	}
	return time.UnixMilli(v).UTC()
}

// Setting returns a setting's value, or ErrNotFound.
func (s *Store) Setting(ctx context.Context, name string) (string, error) {
	var v string
	err := s.db.QueryRowContext(ctx, s.q(`SELECT value FROM settings WHERE name = ?`), name).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("setting %s: %w", name, ErrNotFound)
	}
	return v, err
}

// InitSetting stores value unless the setting exists, and returns what is
// stored: the first of several replicas initializing at once wins.
func (s *Store) InitSetting(ctx context.Context, name, value string) (string, error) {
	if _, err := s.exec(ctx, `INSERT INTO settings (name, value) VALUES (?, ?) ON CONFLICT (name) DO NOTHING`, name, value); err != nil {
		return "", fmt.Errorf("setting %s: %w", name, err)
	}
	return s.Setting(ctx, name)
}

// isUnique reports a unique or primary-key violation, by the drivers'
// error types.
func isUnique(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code == "23505"
	}
	var se *sqlite.Error
	if errors.As(err, &se) {
		return se.Code() == sqlite3.SQLITE_CONSTRAINT_UNIQUE || se.Code() == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY
	}
	return false
}
