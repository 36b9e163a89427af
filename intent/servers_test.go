package intent_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	gomysql "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/fenced-dev/fenced/fence"
	"github.com/fenced-dev/fenced/intent"
	"github.com/fenced-dev/fenced/internal/testkit/opentest"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// TestServers runs the intent tests with the intents in PostgreSQL and in
// MariaDB (the leases stay in SQLite). MariaDB runs with its own defaults,
// so its tables' default collation is latin1_swedish_ci.
func TestServers(t *testing.T) {
	t.Run("Postgres", func(t *testing.T) {
		t.Parallel()
		db := opentest.DB(t, "pgx", testenv.StartPostgres(t).URL())
		t.Run("Lifecycle", func(t *testing.T) { testLifecycle(t, newEnv(t, db, fence.Postgres)) })
		t.Run("Reconcile", func(t *testing.T) { testReconcile(t, newEnv(t, db, fence.Postgres)) })
		for _, tc := range dbTests {
			t.Run(tc.name, func(t *testing.T) { tc.run(t, db, fence.Postgres) })
		}
	})
	t.Run("MySQL", func(t *testing.T) {
		t.Parallel()
		srv := testenv.StartMySQL(t)
		db := opentest.DB(t, "mysql", srv.DSN())
		t.Run("Lifecycle", func(t *testing.T) { testLifecycle(t, newEnv(t, db, fence.MySQL)) })
		t.Run("Reconcile", func(t *testing.T) { testReconcile(t, newEnv(t, db, fence.MySQL)) })
		for _, tc := range dbTests {
			t.Run(tc.name, func(t *testing.T) { tc.run(t, db, fence.MySQL) })
		}
		t.Run("ClientFoundRows", func(t *testing.T) {
			cfg, err := gomysql.ParseDSN(srv.DSN())
			if err != nil {
				t.Fatal(err)
			}
			cfg.ClientFoundRows = true
			testClientFoundRows(t, opentest.DB(t, "mysql", cfg.FormatDSN()))
		})
	})
}

// testClientFoundRows: with clientFoundRows=true MySQL counts a duplicate
// that ON DUPLICATE KEY UPDATE left alone as one affected row. Create used
// to read that as "created", returning the old payload without ErrConflict.
func testClientFoundRows(t *testing.T, db *sql.DB) {
	ctx := context.Background()
	e := newEnvWith(t, db, fence.MySQL, &intent.Options{Table: uniqueTable()})
	if _, created, err := e.store.Create(ctx, "po_1", "a"); err != nil || !created {
		t.Fatalf("first Create: %v %v", created, err)
	}
	if it, created, err := e.store.Create(ctx, "po_1", "b"); !errors.Is(err, intent.ErrConflict) || created || it.Payload != "a" {
		t.Fatalf("Create with another payload: %+v created=%v %v, want ErrConflict", it, created, err)
	}
	if _, created, err := e.store.Create(ctx, "po_1", "a"); err != nil || created {
		t.Fatalf("repeated Create: created=%v %v, want false", created, err)
	}
	testConcurrentCreate(t, db, fence.MySQL)
	testLifecycle(t, newEnvWith(t, db, fence.MySQL, &intent.Options{Table: uniqueTable()}))
}
