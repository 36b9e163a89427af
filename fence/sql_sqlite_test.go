package fence_test

import (
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/fenced-dev/fenced/fence"

	_ "modernc.org/sqlite"
)

// openSQLite opens a fresh SQLite file in a temporary directory, in WAL
// mode with a busy timeout, as applications should, and with BEGIN
// IMMEDIATE.
func openSQLite(t testing.TB) *sql.DB {
	return openSQLiteDSN(t, "?_pragma=busy_timeout(20000)&_pragma=journal_mode(WAL)&_txlock=immediate")
}

// openSQLiteDSN opens a fresh SQLite file with the given DSN parameters.
func openSQLiteDSN(t testing.TB, params string) *sql.DB {
	t.Helper()
	path := filepath.Join(t.TempDir(), "resource.db")
	db, err := sql.Open("sqlite", "file:"+path+params)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func TestSQLGuardSQLite(t *testing.T) {
	runSQLGuardTests(t, sqlEnv{db: openSQLite(t), d: fence.SQLite})
}

// TestSQLGuardSQLiteDeferred runs the same tests with the driver's default
// deferred BEGIN, which most applications get: a transaction starts as a
// reader and takes the write lock at its first write.
func TestSQLGuardSQLiteDeferred(t *testing.T) {
	runSQLGuardTests(t, sqlEnv{db: openSQLiteDSN(t, "?_pragma=busy_timeout(20000)&_pragma=journal_mode(WAL)"), d: fence.SQLite})
}
