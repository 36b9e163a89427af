package intent_test

import (
	"database/sql"
	"testing"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/fenced-dev/fenced/fence"
	"github.com/fenced-dev/fenced/internal/testenv"
)

func openDB(t *testing.T, driverName, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driverName, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.Ping(); err != nil {
		t.Fatal(err)
	}
	return db
}

// TestServers runs the intent tests with the intents in PostgreSQL and in
// MariaDB (the leases stay in SQLite).
func TestServers(t *testing.T) {
	t.Run("Postgres", func(t *testing.T) {
		t.Parallel()
		db := openDB(t, "pgx", testenv.StartPostgres(t).URL())
		t.Run("Lifecycle", func(t *testing.T) { testLifecycle(t, newEnv(t, db, fence.Postgres)) })
		t.Run("Reconcile", func(t *testing.T) { testReconcile(t, newEnv(t, db, fence.Postgres)) })
	})
	t.Run("MySQL", func(t *testing.T) {
		t.Parallel()
		db := openDB(t, "mysql", testenv.StartMySQL(t).DSN())
		t.Run("Lifecycle", func(t *testing.T) { testLifecycle(t, newEnv(t, db, fence.MySQL)) })
		t.Run("Reconcile", func(t *testing.T) { testReconcile(t, newEnv(t, db, fence.MySQL)) })
	})
}
