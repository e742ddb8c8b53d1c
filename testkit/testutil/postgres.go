package testutil

import (
	"context"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// PostgresEnv names the variable that holds the URL of a PostgreSQL server
// for the tests, on which the tests may create and drop databases. `make
// test` (and test-short, bench) sets it to a throwaway server on loopback
// started by scripts/testpg, unless it is already set.
const PostgresEnv = "CELLVISOR_TEST_POSTGRES"

// postgresTimeout bounds each step against the server: connecting, creating
// the database, dropping it.
const postgresTimeout = 30 * time.Second

// Postgres returns the URL of a fresh, empty PostgreSQL database for this
// test alone, on the server that PostgresEnv names, and drops it (closing
// any connection still open to it) when the test ends. It skips the test,
// saying why, when PostgresEnv is not set. The URL has the same host, port,
// user and query as PostgresEnv's, sslmode=disable unless that sets another.
func Postgres(t testing.TB) string {
	t.Helper()
	admin := os.Getenv(PostgresEnv)
	if admin == "" {
		t.Skip(PostgresEnv + " is not set: run through `make test`, which starts a PostgreSQL on loopback")
	}
	u, err := url.Parse(admin)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") || u.Host == "" {
		t.Fatalf("%s=%q: want a URL like postgres://postgres@127.0.0.1:15432/cellvisor_test?sslmode=disable", PostgresEnv, admin)
	}

	// run runs one statement on the server, failing the test on an error.
	run := func(sql, what string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), postgresTimeout)
		defer cancel()
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			t.Fatalf("%s: connect to %s (%s): %v", what, PostgresEnv, u.Redacted(), err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}

	name := "cv_" + randHex(6)
	ident := pgx.Identifier{name}.Sanitize()
	run("CREATE DATABASE "+ident, "create database "+name)
	t.Cleanup(func() { run("DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)", "drop database "+name) })

	db := *u
	db.Path, db.RawPath = "/"+name, ""
	q := db.Query()
	if q.Get("sslmode") == "" {
		q.Set("sslmode", "disable")
	}
	db.RawQuery = q.Encode()
	return db.String()
}
