package main

import (
	"context"
	"database/sql"
	"path/filepath"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"

	_ "github.com/fenced-dev/fenced/fencedmysql"
	_ "github.com/fenced-dev/fenced/fencedpostgres"
	_ "github.com/fenced-dev/fenced/fencedsqlite"

	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// renewalTTL is the renewal workload's TTL on the stores that take a
// write (and a disk flush) per request: room for M one-by-one renewals a
// period.
func renewalTTL(m int) time.Duration {
	if m > 20000 {
		return 30 * time.Second
	}
	return 9 * time.Second
}

// postgresBackend is a PostgreSQL with synchronous_commit on (every grant
// waits for its WAL flush) and pg_stat_statements, which counts the
// statements the server ran. There is no Go lease library on PostgreSQL
// to compare with in the same run (pglock polls once per lease period).
func postgresBackend(tb *testenv.MainTB) *backend {
	pg := testenv.StartPostgres(tb, "shared_preload_libraries=pg_stat_statements", "pg_stat_statements.track=all")
	url := pg.URL()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		tb.Fatalf("postgres: %v", err)
	}
	tb.Cleanup(func() { conn.Close(context.Background()) })
	if _, err := conn.Exec(context.Background(), "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		tb.Fatalf("postgres: %v", err)
	}
	count := selfCorrecting(func() (int64, error) {
		var n int64
		err := conn.QueryRow(context.Background(), "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements").Scan(&n)
		return n, err
	})
	return &backend{
		name: "postgres", impls: fencedImpls([]string{url}), spawn: spawnSpec{Set: "fenced", Args: []string{url}},
		holders: []holderImpl{{name: "fenced", how: "Client auto-renew (driver batch renewal where it has one)",
			open: openFencedHolder(url)}},
		count: count, renewalCount: count, renewalTTL: renewalTTL,
		note: "PostgreSQL, synchronous_commit on; requests are statements run (pg_stat_statements calls, nested ones included); " +
			"no incumbent in the run",
	}
}

// mysqlBackend is a MariaDB; requests are its Questions (statements sent
// by clients).
func mysqlBackend(tb *testenv.MainTB) *backend {
	my := testenv.StartMySQL(tb)
	url := my.URL()
	db, err := sql.Open("mysql", my.DSN())
	if err != nil {
		tb.Fatalf("mysql: %v", err)
	}
	db.SetMaxOpenConns(1)
	tb.Cleanup(func() { db.Close() })
	count := selfCorrecting(func() (int64, error) {
		var name string
		var n int64
		err := db.QueryRow("SHOW GLOBAL STATUS LIKE 'Questions'").Scan(&name, &n)
		return n, err
	})
	return &backend{
		name: "mysql", impls: fencedImpls([]string{url}), spawn: spawnSpec{Set: "fenced", Args: []string{url}},
		holders: []holderImpl{{name: "fenced", how: "Client auto-renew (driver batch renewal where it has one)",
			open: openFencedHolder(url)}},
		count: count, renewalCount: count, renewalTTL: renewalTTL,
		note: "MariaDB; requests are the server's Questions (statements from clients); no incumbent in the run",
	}
}

// sqliteBackend is one database file, each process its own pool on it.
// An embedded store has no server to count requests.
func sqliteBackend(tb *testenv.MainTB) *backend {
	url := "sqlite://" + filepath.Join(testenv.TempDir(tb, "sqlite"), "leases.db")
	return &backend{
		name: "sqlite", impls: fencedImpls([]string{url}), spawn: spawnSpec{Set: "fenced", Args: []string{url}},
		holders: []holderImpl{{name: "fenced", how: "Client auto-renew (driver batch renewal where it has one)",
			open: openFencedHolder(url)}},
		renewalTTL: renewalTTL,
		note:       "SQLite file (WAL); embedded, so no server-side request count; no incumbent in the run",
	}
}

// selfCorrecting wraps a server counter whose own query is counted by the
// server: each call subtracts the queries made before it.
func selfCorrecting(read func() (int64, error)) counter {
	var calls int64
	return func() (int64, error) {
		n, err := read()
		n -= calls
		calls++
		return n, err
	}
}
