package fence_test

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

func TestSQLGuardPostgres(t *testing.T) {
	t.Parallel()
	pg := testenv.StartPostgres(t)
	runSQLGuardTests(t, sqlEnv{db: openDB(t, "pgx", pg.URL()), d: fence.Postgres})
}

// TestSQLGuardMySQL runs on MariaDB with the driver's default settings:
// affected rows count changed rows, not matched ones, which the guard
// accounts for.
func TestSQLGuardMySQL(t *testing.T) {
	t.Parallel()
	my := testenv.StartMySQL(t)
	runSQLGuardTests(t, sqlEnv{db: openDB(t, "mysql", my.DSN()), d: fence.MySQL})
}
