package fencedsqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedsqlite"
)

// plainDB opens a new file in a temporary directory the way most programs
// open SQLite (deferred transactions, a busy timeout, nothing else), closed
// when the test ends.
func plainDB(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "leases.db")+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// Tables made by someone else (issue 9 item 7, issue 16 item 4): a key or
// owner column that compares case-insensitively or ignores trailing
// spaces, or a key without a unique index of its own, is refused with
// ErrSchema naming the difference, and the refused open creates nothing.
// The database is opened the way most programs open SQLite (deferred
// transactions), not only with fenced's _txlock=immediate.
func TestForeignLeaseTablesAreRefused(t *testing.T) {
	const cols = `owner TEXT, fence INTEGER NOT NULL, expires_ms INTEGER NOT NULL, granted_ms INTEGER NOT NULL`
	cases := []struct {
		name, create, says string
	}{
		{"no unique index", `CREATE TABLE {T} (key TEXT NOT NULL, ` + cols + `)`,
			"no primary key or unique index on key alone"},
		{"NOCASE key", `CREATE TABLE {T} (key TEXT COLLATE NOCASE PRIMARY KEY NOT NULL, ` + cols + `) WITHOUT ROWID`,
			"column key: a collation that compares case-insensitively"},
		{"RTRIM owner", `CREATE TABLE {T} (key TEXT PRIMARY KEY NOT NULL, owner TEXT COLLATE RTRIM, fence INTEGER NOT NULL, expires_ms INTEGER NOT NULL, granted_ms INTEGER NOT NULL)`,
			"column owner: a collation that ignores trailing spaces"},
		{"NOCASE unique index", `CREATE TABLE {T} (key TEXT NOT NULL, ` + cols + `);
CREATE UNIQUE INDEX {T}_nocase ON {T} (key COLLATE NOCASE)`,
			"uses collation NOCASE"},
		{"partial unique index", `CREATE TABLE {T} (key TEXT NOT NULL, ` + cols + `);
CREATE UNIQUE INDEX {T}_part ON {T} (key) WHERE owner IS NOT NULL`,
			"has a WHERE clause"},
		{"another unique index", `CREATE TABLE {T} (key TEXT PRIMARY KEY NOT NULL, ` + cols + `, UNIQUE (fence))`,
			"could make the grants of two different keys collide"},
		{"text fence", `CREATE TABLE {T} (key TEXT PRIMARY KEY NOT NULL, owner TEXT, fence TEXT NOT NULL, expires_ms INTEGER NOT NULL, granted_ms INTEGER NOT NULL)`,
			"column fence is text, want integer"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			db := plainDB(t)
			table := fmt.Sprintf("foreign_%d", i)
			for _, q := range strings.Split(strings.ReplaceAll(tc.create, "{T}", table), ";\n") {
				if _, err := db.ExecContext(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			d, err := fencedsqlite.New(ctx, db, &fencedsqlite.Options{Table: table})
			if err == nil {
				d.Close()
				t.Fatalf("New accepted the table")
			}
			if !errors.Is(err, fencedsqlite.ErrSchema) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("New: %v\nwant ErrSchema saying %q", err, tc.says)
			}
			var n int
			if err := db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name LIKE ?1`, table+"_%").Scan(&n); err != nil || n != 0 {
				t.Errorf("the refused open created %d tables (%v)", n, err)
			}
		})
	}
}

// Keys and owners that differ in case or by a trailing space are distinct
// in the tables fenced creates, over a database opened with deferred
// transactions.
func TestKeysAndOwnersAreExact(t *testing.T) {
	ctx := context.Background()
	db := plainDB(t)
	d, err := fencedsqlite.New(ctx, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for i, k := range []string{"job:a", "job:A", "job:a "} {
		if f, err := d.TryAcquire(ctx, k, fmt.Sprintf("owner-%d", i), time.Minute); err != nil || f != 1 {
			t.Fatalf("acquire %q: %d, %v; want a grant of its own", k, f, err)
		}
	}
	if _, err := d.TryAcquire(ctx, "job:a", "OWNER-0", time.Minute); !errors.Is(err, fenced.ErrHeld) {
		t.Errorf("acquire of job:a by OWNER-0: %v, want ErrHeld", err)
	}
	if deleted, _, err := d.Prune(ctx, 0); err != nil || deleted != 0 {
		t.Errorf("Prune over held keys = %d deleted, %v; want nothing deleted", deleted, err)
	}
}
