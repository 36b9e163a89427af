package fencedpostgres_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedpostgres"
)

// Tables made by someone else (issue 9 item 7, issue 16 item 4): each
// shape that lets two keys reach one row (a nondeterministic collation),
// or that ON CONFLICT cannot use, is refused with ErrSchema naming the
// difference, and the refused open creates nothing.
func TestForeignLeaseTablesAreRefused(t *testing.T) {
	ctx := ctxT(t)
	conn, err := pgx.Connect(ctx, pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE COLLATION IF NOT EXISTS fenced_test_ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false)`); err != nil {
		t.Fatal(err)
	}
	const cols = `owner text NOT NULL, fence bigint NOT NULL, expires_at timestamptz NOT NULL`
	cases := []struct {
		name, create, says string
	}{
		{"no unique index", `CREATE TABLE {T} (lease_key text NOT NULL, ` + cols + `)`,
			"no primary key or unique index on lease_key alone"},
		{"case-insensitive key", `CREATE TABLE {T} (lease_key text COLLATE fenced_test_ci PRIMARY KEY, ` + cols + `)`,
			`column lease_key: nondeterministic collation "fenced_test_ci"`},
		{"case-insensitive owner", `CREATE TABLE {T} (lease_key text PRIMARY KEY, owner text COLLATE fenced_test_ci NOT NULL, fence bigint NOT NULL, expires_at timestamptz NOT NULL)`,
			`column owner: nondeterministic collation "fenced_test_ci"`},
		{"case-insensitive unique index", `CREATE TABLE {T} (lease_key text NOT NULL, ` + cols + `);
CREATE UNIQUE INDEX {T}_ci ON {T} (lease_key COLLATE fenced_test_ci)`,
			`uses nondeterministic collation "fenced_test_ci"`},
		{"partial unique index", `CREATE TABLE {T} (lease_key text NOT NULL, ` + cols + `);
CREATE UNIQUE INDEX {T}_part ON {T} (lease_key) WHERE owner <> ''`,
			"has a WHERE clause"},
		{"deferrable key", `CREATE TABLE {T} (lease_key text NOT NULL, ` + cols + `, CONSTRAINT {T}_u UNIQUE (lease_key) DEFERRABLE INITIALLY DEFERRED)`,
			"is deferrable"},
		{"another unique index", `CREATE TABLE {T} (lease_key text PRIMARY KEY, ` + cols + `, UNIQUE (fence))`,
			"could make the grants of two different keys collide"},
		{"expiry in whole seconds", `CREATE TABLE {T} (lease_key text PRIMARY KEY, owner text NOT NULL, fence bigint NOT NULL, expires_at timestamptz(0) NOT NULL)`,
			"column expires_at is timestamp(0) with time zone, want timestamp with time zone"},
		{"a view", `CREATE VIEW {T} AS SELECT 'k'::text AS lease_key, 'o'::text AS owner, 1::bigint AS fence, now() AS expires_at`,
			"it is a view"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			table := fmt.Sprintf("foreign_%d", i)
			drop := fmt.Sprintf("DROP VIEW IF EXISTS %[1]s; DROP TABLE IF EXISTS %[1]s, %[1]s_breaks, %[1]s_floor", table)
			if _, err := conn.Exec(ctx, drop+";\n"+strings.ReplaceAll(tc.create, "{T}", table)); err != nil {
				t.Fatal(err)
			}
			d, err := fencedpostgres.Open(ctx, pg.URL("table="+table, "notify=off"))
			if err == nil {
				defer d.Close()
				t.Fatalf("Open accepted the table")
			}
			if !errors.Is(err, fencedpostgres.ErrSchema) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("Open: %v\nwant ErrSchema saying %q", err, tc.says)
			}
			var created bool
			if err := conn.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL OR to_regclass($2) IS NOT NULL`, table+"_breaks", table+"_floor").Scan(&created); err != nil || created {
				t.Errorf("the refused open created tables (%v, %v)", created, err)
			}
		})
	}
}

// Keys and owners that differ in case or by a trailing space are distinct
// in the tables fenced creates.
func TestKeysAndOwnersAreExact(t *testing.T) {
	ctx := ctxT(t)
	d := open(t, "table=exact_leases", "notify=off")
	for i, k := range []string{"job:a", "job:A", "job:a "} {
		if f, err := d.TryAcquire(ctx, k, fmt.Sprintf("owner-%d", i), time.Minute); err != nil {
			t.Fatalf("acquire %q: %d, %v; want a grant of its own", k, f, err)
		}
	}
	if _, err := d.TryAcquire(ctx, "job:a", "OWNER-0", time.Minute); !errors.Is(err, fenced.ErrHeld) {
		t.Errorf("acquire of job:a by OWNER-0: %v, want ErrHeld", err)
	}
}

// Tables created by the previous version of fenced (no floor table, owner
// in the database's default collation) open as they are: the floor table
// is added and fences continue from the rows' counters.
func TestPreviousVersionTablesOpen(t *testing.T) {
	ctx := ctxT(t)
	conn, err := pgx.Connect(ctx, pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `DROP TABLE IF EXISTS prev_leases, prev_leases_breaks, prev_leases_floor;
CREATE TABLE prev_leases (
  lease_key  text COLLATE "C" PRIMARY KEY,
  owner      text NOT NULL,
  fence      bigint NOT NULL CHECK (fence > 0),
  expires_at timestamptz NOT NULL
);
CREATE TABLE prev_leases_breaks (
  id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  broken_at  timestamptz NOT NULL DEFAULT now(),
  lease_key  text COLLATE "C" NOT NULL,
  fence      bigint NOT NULL,
  owner      text NOT NULL,
  reason     text NOT NULL,
  broken_by  text NOT NULL
);
CREATE INDEX prev_leases_breaks_key ON prev_leases_breaks (lease_key, id);
INSERT INTO prev_leases VALUES ('job:old', '', 41, now() - interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	d := open(t, "table=prev_leases", "notify=off")
	if f, err := d.TryAcquire(ctx, "job:old", "someone", time.Minute); err != nil || f != 42 {
		t.Fatalf("grant of a key from the previous version: %d, %v; want 42", f, err)
	}
	if floor, maxFence, err := d.FenceFloor(ctx); err != nil || floor != 0 || maxFence != 42 {
		t.Fatalf("FenceFloor = %d, %d, %v; want 0, 42", floor, maxFence, err)
	}
}
