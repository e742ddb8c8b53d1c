package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"cellvisor/testkit/testutil"
)

// A status report is one write: the status, the egress part and the
// gateways in one transaction, counted once as PutStatus.
func TestStatusReportIsOneWrite(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		e := newEdge(t, s, "a")
		var writes []string
		s.Hooks.Wrote = func(kind string) { writes = append(writes, kind) }
		at := time.UnixMilli(1_800_000_000_000).UTC()
		r := Report{Status: []byte(`{"version":"t"}`), At: at, IntakeURL: "https://127.0.0.1:7001/",
			Reach:    map[string]Reach{"metering": {Destination: "https://d/m", Reachable: true, CheckedAt: at}},
			Gateways: []Gateway{gw("https", 8443, true)}, GatewaysAt: at, SyncGateways: true}
		if err := s.PutStatus(ctx(t), e.ID, r); err != nil {
			t.Fatal(err)
		}
		if len(writes) != 1 || writes[0] != "PutStatus" {
			t.Fatalf("writes %v, want one PutStatus", writes)
		}
		got, err := s.EgressEdge(ctx(t), e.ID)
		if err != nil || got.IntakeURL != r.IntakeURL {
			t.Fatalf("egress edge %+v, %v", got, err)
		}
		if gws, err := s.Gateways(ctx(t), e.ID); err != nil || len(gws) != 1 || gws[0].Port != 8443 || !gws[0].LastSeen.Equal(at) {
			t.Fatalf("gateways %+v, %v", gws, err)
		}
		// A report without an egress or gateways part: one write, which
		// clears the egress part and leaves the gateways.
		writes = nil
		if err := s.PutStatus(ctx(t), e.ID, Report{Status: []byte(`{"version":"u"}`), At: at}); err != nil {
			t.Fatal(err)
		}
		if len(writes) != 1 || writes[0] != "PutStatus" {
			t.Fatalf("writes %v, want one PutStatus", writes)
		}
		if got, _ := s.EgressEdge(ctx(t), e.ID); got.IntakeURL != "" {
			t.Fatalf("intake %q after a report without an egress part", got.IntakeURL)
		}
		if gws, _ := s.Gateways(ctx(t), e.ID); len(gws) != 1 {
			t.Fatalf("gateways %+v after a report without a gateways part", gws)
		}
		if err := s.PutStatus(ctx(t), "no-such-edge", r); !errors.Is(err, ErrNotFound) {
			t.Fatalf("status of an unknown edge: %v, want ErrNotFound", err)
		}
	})
}

// A status write that meets a busy database waits its turn: SQLite's write
// lock held by another connection past the busy timeout, PostgreSQL's row
// lock held by another transaction. It is written once the lock is let go,
// and fails only when its context ends.
func TestStatusWaitsForABusyDatabase(t *testing.T) {
	defer func(d time.Duration) { sqliteBusyTimeout = d }(sqliteBusyTimeout)
	sqliteBusyTimeout = 50 * time.Millisecond
	run := func(t *testing.T, s *Store, dsn string) {
		e := newEdge(t, s, "a")
		var retried atomic.Int64
		s.Hooks.Retried = func(error) { retried.Add(1) }
		// Another writer takes the lock and holds it.
		other, err := sql.Open(map[string]string{SQLite: "sqlite", Postgres: "pgx"}[s.Dialect()], map[string]string{SQLite: "file:" + dsn, Postgres: dsn}[s.Dialect()])
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		conn, err := other.Conn(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		hold := `BEGIN IMMEDIATE`
		if s.Dialect() == Postgres {
			hold = `BEGIN; SELECT 1 FROM edges WHERE id = '` + e.ID + `' FOR UPDATE`
		}
		if _, err := conn.ExecContext(ctx(t), hold); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			done <- s.PutStatus(ctx(t), e.ID, Report{Status: []byte(`{"version":"busy"}`), At: time.Now()})
		}()
		// The write is waiting: SQLite answered busy at least twice (each
		// after the busy timeout), PostgreSQL shows it waiting on the lock.
		waiting := func() error {
			if s.Dialect() == SQLite {
				if n := retried.Load(); n < 2 {
					return fmt.Errorf("%d retries", n)
				}
				return nil
			}
			var n int
			if err := s.db.QueryRowContext(ctx(t), `SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`).Scan(&n); err != nil {
				return err
			}
			if n == 0 {
				return errors.New("no write waiting on the lock")
			}
			return nil
		}
		testutil.Eventually(t, 20*time.Second, func() error {
			select {
			case err := <-done:
				t.Fatalf("the status write returned while the database was busy: %v", err)
			default:
			}
			return waiting()
		})
		if _, err := conn.ExecContext(ctx(t), `ROLLBACK`); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("status write after the lock was let go: %v", err)
		}
		if got := mustEdge(t, s, e.ID); string(got.Status) != `{"version":"busy"}` {
			t.Fatalf("stored status %s", got.Status)
		}
		// A context that ends stops the waiting, with the error.
		if _, err := conn.ExecContext(ctx(t), hold); err != nil {
			t.Fatal(err)
		}
		short, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		if err := s.PutStatus(short, e.ID, Report{Status: []byte(`{}`), At: time.Now()}); err == nil {
			t.Fatal("a status write succeeded while the lock was held")
		}
		conn.ExecContext(ctx(t), `ROLLBACK`)
	}
	t.Run(SQLite, func(t *testing.T) {
		dsn := filepath.Join(t.TempDir(), "control.db")
		run(t, open(t, dsn), dsn)
	})
	t.Run(Postgres, func(t *testing.T) {
		dsn := testutil.Postgres(t)
		run(t, open(t, dsn), dsn)
	})
}

// This process's SQLite writers wait for one another in the store, not in
// SQLite's busy handler holding a connection each: with one write open and
// more writers than the pool has connections queued behind it, a read
// still gets a connection and answers. (Before, the queued writers held
// every connection, sleeping in the busy handler, and the read waited for
// the open write to end.)
func TestQueuedWritesLeaveReadsAConnection(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "control.db"))
	e := newEdge(t, s, "a")
	release, inside := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		first <- s.tx(ctx(t), func(tx *sql.Tx) error {
			close(inside)
			<-release
			return nil
		})
	}()
	<-inside
	queued := make(chan error, 12)
	for range cap(queued) { // more than the pool's 8 connections
		go func() {
			queued <- s.tx(ctx(t), func(tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx(t), `UPDATE edges SET name = name WHERE id = ?`, e.ID)
				return err
			})
		}()
	}
	// Every queued writer waits: in the store, or (before) in SQLite's busy
	// handler with the pool's every connection.
	testutil.Eventually(t, 10*time.Second, func() error {
		if w, st := s.writeWaiters.Load(), s.db.Stats(); w != int64(cap(queued)) && st.InUse < st.MaxOpenConnections {
			return fmt.Errorf("%d writes waiting in the store, %d of %d connections in use", w, st.InUse, st.MaxOpenConnections)
		}
		return nil
	})
	rctx, cancel := context.WithTimeout(ctx(t), 5*time.Second)
	defer cancel()
	_, err := s.Edge(rctx, e.ID)
	close(release)
	if err != nil {
		t.Fatalf("a read with a write open and %d queued: %v", cap(queued), err)
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for range cap(queued) {
		if err := <-queued; err != nil {
			t.Errorf("a queued write: %v", err)
		}
	}
}
