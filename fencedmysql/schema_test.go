package fencedmysql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/fencedmysql"
)

func rawDB(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", my.DSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func exec(t *testing.T, db *sql.DB, queries ...string) {
	t.Helper()
	for _, q := range queries {
		if _, err := db.ExecContext(ctxT(t), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// tablesLike lists the tables whose names start with prefix.
func tablesLike(t *testing.T, db *sql.DB, prefix string) []string {
	t.Helper()
	rows, err := db.QueryContext(ctxT(t), `SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name LIKE CONCAT(?, '%') ORDER BY table_name`, prefix)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		out = append(out, n)
	}
	return out
}

// doubleGrant says whether two owners can both be granted one key through
// d, for the failure message of a test whose table should have been
// refused.
func doubleGrant(ctx context.Context, d driver.Driver) string {
	f1, err1 := d.TryAcquire(ctx, "job:double", "owner-one", time.Minute)
	f2, err2 := d.TryAcquire(ctx, "job:double", "owner-two", time.Minute)
	if err1 == nil && err2 == nil {
		return fmt.Sprintf("two owners were granted job:double, with fences %d and %d", f1, f2)
	}
	return fmt.Sprintf("grants of job:double: %d, %v; %d, %v", f1, err1, f2, err2)
}

// Tables made by someone else (issue 9 item 7, issue 16 item 4): each
// shape that lets one key reach two rows, two keys one row, or a fence be
// misreported is refused with ErrSchema naming the difference, and the
// refused open creates nothing.
func TestForeignLeaseTablesAreRefused(t *testing.T) {
	const cols = `owner VARBINARY(255) NOT NULL, fence BIGINT UNSIGNED NOT NULL, expires_at DATETIME(6) NOT NULL`
	cases := []struct {
		name, create, says string
	}{
		{"no unique key", `(lease_key VARBINARY(256) NOT NULL, ` + cols + `) ENGINE=InnoDB`,
			"no primary key or unique index on lease_key alone"},
		{"key and owner unique together", `(lease_key VARBINARY(256) NOT NULL, ` + cols + `, PRIMARY KEY (lease_key, owner)) ENGINE=InnoDB`,
			"unique index PRIMARY on (lease_key, owner) could make the grants of two different keys collide"},
		{"prefix unique key", `(lease_key VARBINARY(256) NOT NULL, ` + cols + `, UNIQUE KEY k8 (lease_key(8))) ENGINE=InnoDB`,
			"unique index k8 on (lease_key) covers only the first 8 bytes"},
		{"another unique key", `(lease_key VARBINARY(256) NOT NULL PRIMARY KEY, ` + cols + `, UNIQUE KEY f (fence)) ENGINE=InnoDB`,
			"unique index f on (fence) could make the grants of two different keys collide"},
		{"extra AUTO_INCREMENT column", `(lease_key VARBINARY(256) NOT NULL PRIMARY KEY, ` + cols + `, n BIGINT NOT NULL AUTO_INCREMENT, KEY (n)) ENGINE=InnoDB`,
			"column n is AUTO_INCREMENT"},
		{"latin1_swedish_ci key and owner", `(lease_key VARCHAR(256) CHARACTER SET latin1 COLLATE latin1_swedish_ci NOT NULL PRIMARY KEY,
  owner VARCHAR(255) CHARACTER SET latin1 COLLATE latin1_swedish_ci NOT NULL, fence BIGINT UNSIGNED NOT NULL, expires_at DATETIME(6) NOT NULL) ENGINE=InnoDB`,
			"column lease_key is varchar with collation latin1_swedish_ci, which compares case-insensitively and ignores trailing spaces, want varbinary"},
		{"utf8mb4_bin pads spaces", `(lease_key VARCHAR(256) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY, ` + cols + `) ENGINE=InnoDB`,
			"collation utf8mb4_bin, which ignores trailing spaces"},
		{"key column too short", `(lease_key VARBINARY(64) NOT NULL PRIMARY KEY, ` + cols + `) ENGINE=InnoDB`,
			"column lease_key holds at most 64 bytes, want 256"},
		{"expiry in whole seconds", `(lease_key VARBINARY(256) NOT NULL PRIMARY KEY, owner VARBINARY(255) NOT NULL, fence BIGINT UNSIGNED NOT NULL, expires_at DATETIME NOT NULL) ENGINE=InnoDB`,
			"column expires_at is datetime(0), want datetime(6)"},
		{"MyISAM", `(lease_key VARBINARY(256) NOT NULL PRIMARY KEY, ` + cols + `) ENGINE=MyISAM`,
			"its engine is MyISAM, want InnoDB"},
	}
	db := rawDB(t)
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxT(t)
			table := fmt.Sprintf("foreign_%d", i)
			exec(t, db, "DROP TABLE IF EXISTS "+table+", "+table+"_breaks, "+table+"_floor", "CREATE TABLE "+table+" "+tc.create)
			d, err := fencedmysql.Open(ctx, my.URL("table="+table))
			if err == nil {
				defer d.Close()
				t.Fatalf("Open accepted the table; %s", doubleGrant(ctx, d))
			}
			if !errors.Is(err, fencedmysql.ErrSchema) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("Open: %v\nwant ErrSchema saying %q", err, tc.says)
			}
			if got := tablesLike(t, db, table); len(got) != 1 {
				t.Errorf("the refused open left tables %v, want only %s", got, table)
			}
		})
	}
}

// The audit and floor tables are checked too, before anything is created.
func TestForeignFloorTableIsRefused(t *testing.T) {
	ctx := ctxT(t)
	db := rawDB(t)
	exec(t, db, "DROP TABLE IF EXISTS foreignfl, foreignfl_breaks, foreignfl_floor",
		"CREATE TABLE foreignfl_floor (id INT NOT NULL, fence_floor INT NOT NULL) ENGINE=InnoDB")
	_, err := fencedmysql.Open(ctx, my.URL("table=foreignfl"))
	for _, want := range []string{`table "foreignfl_floor"`, "column id is int, want tinyint", "column fence_floor is int, want bigint", "no primary key or unique index on id alone"} {
		if !errors.Is(err, fencedmysql.ErrSchema) || !strings.Contains(err.Error(), want) {
			t.Errorf("Open over a foreign floor table: %v\nwant ErrSchema saying %q", err, want)
		}
	}
	if got := tablesLike(t, db, "foreignfl"); len(got) != 1 {
		t.Errorf("the refused open left tables %v, want only foreignfl_floor", got)
	}
}

// On a server whose default character set is latin1 (MariaDB's own
// default, and the test server's), the tables fenced creates keep keys
// that differ in case or by a trailing space apart, and compare owners
// byte for byte (issue 16 item 4).
func TestKeysAndOwnersAreExactOnLatin1Server(t *testing.T) {
	ctx := ctxT(t)
	db := rawDB(t)
	var charset, collation string
	if err := db.QueryRowContext(ctx, "SELECT @@character_set_server, @@collation_server").Scan(&charset, &collation); err != nil {
		t.Fatal(err)
	}
	if charset != "latin1" || collation != "latin1_swedish_ci" {
		t.Fatalf("server default %s/%s; the test needs latin1/latin1_swedish_ci", charset, collation)
	}
	exec(t, db, "DROP TABLE IF EXISTS exact_leases, exact_leases_breaks, exact_leases_floor")
	d, err := fencedmysql.Open(ctx, my.URL("table=exact_leases"))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	keys := []string{"job:a", "job:A", "job:a "}
	owners := []string{"worker-a", "Worker-A", "worker-a "}
	grants := make([]driver.Grant, len(keys))
	for i, k := range keys {
		f, err := d.TryAcquire(ctx, k, owners[i], time.Minute)
		if err != nil || f != 1 {
			t.Fatalf("acquire %q by %q: fence %d, %v; want a grant of its own with fence 1", k, owners[i], f, err)
		}
		grants[i] = driver.Grant{Key: k, Owner: owners[i], Fence: f, TTL: time.Minute}
	}
	infos, err := d.List(ctx, "job:")
	if err != nil || len(infos) != 3 {
		t.Fatalf("List = %+v, %v; want three keys", infos, err)
	}
	// Owners that differ only in case or a trailing space are strangers.
	for _, o := range owners[1:] {
		if _, err := d.TryAcquire(ctx, "job:a", o, time.Minute); !errors.Is(err, fenced.ErrHeld) {
			t.Errorf("acquire of job:a by %q: %v, want ErrHeld", o, err)
		}
		if err := d.Renew(ctx, driver.Grant{Key: "job:a", Owner: o, Fence: 1, TTL: time.Minute}); !errors.Is(err, fenced.ErrNotHeld) {
			t.Errorf("renew of job:a by %q: %v, want ErrNotHeld", o, err)
		}
		if err := d.Release(ctx, driver.Grant{Key: "job:a", Owner: o, Fence: 1}); !errors.Is(err, fenced.ErrNotHeld) {
			t.Errorf("release of job:a by %q: %v, want ErrNotHeld", o, err)
		}
	}
	if _, err := d.Break(ctx, "job:A", "test", t.Name()); err != nil {
		t.Fatal(err)
	}
	if recs, err := d.Breaks(ctx, "job:a"); err != nil || len(recs) != 0 {
		t.Errorf("breaks of job:a after breaking job:A: %+v, %v; want none", recs, err)
	}
	if err := d.Renew(ctx, grants[0]); err != nil {
		t.Errorf("job:a's holder after job:A was broken: %v", err)
	}
}
