package fence_test

import (
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/fenced-dev/fenced/fence"

	_ "modernc.org/sqlite"
)

// openSQLite opens a fresh SQLite file in a temporary directory, in WAL
// mode with a busy timeout, as applications should.
func openSQLite(t testing.TB) *sql.DB {
	t.Helper()
	path := filepath.Join(t.TempDir(), "resource.db")
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(20000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func TestSQLGuardSQLite(t *testing.T) {
	runSQLGuardTests(t, sqlEnv{db: openSQLite(t), d: fence.SQLite})
}
