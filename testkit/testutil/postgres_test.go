package testutil_test

import (
	"context"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"cellvisor/testkit/testutil"
)

// TestPostgres: each call gives a fresh, empty, usable database of its own,
// and the database is gone once the test that asked for it ends, even with a
// connection to it left open.
func TestPostgres(t *testing.T) {
	var names []string
	var lingering *pgx.Conn
	t.Run("fresh databases", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for range 2 {
			u := testutil.Postgres(t)
			parsed, err := url.Parse(u)
			if err != nil {
				t.Fatal(err)
			}
			if got := parsed.Query().Get("sslmode"); got == "" {
				t.Errorf("%s: no sslmode", u)
			}
			name := strings.TrimPrefix(parsed.Path, "/")
			names = append(names, name)

			conn, err := pgx.Connect(ctx, u)
			if err != nil {
				t.Fatal(err)
			}
			var one int
			if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
				t.Fatalf("SELECT 1: %d, %v", one, err)
			}
			var db string
			var tables int
			if err := conn.QueryRow(ctx, `SELECT current_database(),
				(SELECT count(*) FROM pg_tables WHERE schemaname = 'public')`).Scan(&db, &tables); err != nil {
				t.Fatal(err)
			}
			if db != name || tables != 0 {
				t.Fatalf("connected to %q with %d tables, want %q, empty", db, tables, name)
			}
			if _, err := conn.Exec(ctx, "CREATE TABLE t (id int PRIMARY KEY, v text NOT NULL)"); err != nil {
				t.Fatal(err)
			}
			if _, err := conn.Exec(ctx, "INSERT INTO t VALUES (1, 'a')"); err != nil {
				t.Fatal(err)
			}
			// The first connection stays open past the test: the drop must
			// not wait for it.
			if lingering == nil {
				lingering = conn
			} else {
				conn.Close(ctx)
			}
		}
		if len(names) == 2 && names[0] == names[1] {
			t.Errorf("two calls gave the same database %q", names[0])
		}
	})
	if lingering != nil {
		defer lingering.Close(context.Background())
	}
	if len(names) == 0 {
		t.Skip("no database was made (the subtest says why)")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, os.Getenv(testutil.PostgresEnv))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	var left int
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_database WHERE datname = ANY($1)", names).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d of the databases %v are still there after their test ended", left, names)
	}
}
