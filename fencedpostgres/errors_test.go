package fencedpostgres_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedpostgres"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

func TestOpenErrorsNameTheProblem(t *testing.T) {
	ctx := ctxT(t)
	const badPassword = "not-the-Password-42"
	cases := []struct {
		name, url string
		want      error
		says      string
	}{
		{"wrong password", pg.URLAs(pg.User, badPassword), fenced.ErrUnavailable, "authentication failed"},
		{"unknown user", pg.URLAs("nobody_here", badPassword), fenced.ErrUnavailable, "authentication failed"},
		{"unreachable server", "postgres://fenced:" + badPassword + "@" + testenv.Addr(testenv.FreePort(t)) + "/postgres?sslmode=disable&connect_timeout=5", fenced.ErrUnavailable, "cannot connect"},
		{"bad table name", pg.URL("table=Robert');DROP"), fenced.ErrInvalidURL, ""},
		{"upper-case table name", pg.URL("table=Leases"), fenced.ErrInvalidURL, "table name"},
		{"overlong table name", pg.URL("table=" + strings.Repeat("t", 49)), fenced.ErrInvalidURL, "longer than 48"},
		{"bad pgx parameter", "postgres://fenced:" + badPassword + "@127.0.0.1:1/db?sslmode=sometimes", fenced.ErrInvalidURL, "sslmode"},
		{"password in the query", "postgres://127.0.0.1:1/db?password=" + badPassword + "&sslmode=sometimes", fenced.ErrInvalidURL, "sslmode"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := fenced.Open(ctx, tc.url, nil)
			if err == nil {
				c.Close()
				t.Fatalf("Open succeeded, want %v", tc.want)
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("Open error %q, want %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.says) {
				t.Errorf("error %q does not say %q", err, tc.says)
			}
			if strings.Contains(err.Error(), badPassword) || strings.Contains(err.Error(), pg.Password) {
				t.Errorf("error reveals a password: %q", err)
			}
			t.Logf("%s: %v", tc.name, err)
		})
	}
}

func TestOldShapeTableIsRefused(t *testing.T) {
	ctx := ctxT(t)
	conn, err := pgx.Connect(ctx, pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// The shape of the classic lease-table recipe: another key column, and
	// a 32-bit counter.
	if _, err := conn.Exec(ctx, `DROP TABLE IF EXISTS old_leases, old_leases_breaks;
CREATE TABLE old_leases (lock_key text PRIMARY KEY, owner text NOT NULL, fence integer NOT NULL, expires_at timestamptz NOT NULL);
INSERT INTO old_leases VALUES ('k', 'someone', 41, now() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	_, err = fencedpostgres.Open(ctx, pg.URL("table=old_leases"))
	if !errors.Is(err, fencedpostgres.ErrSchema) {
		t.Fatalf("Open over an old-shape table: %v, want ErrSchema", err)
	}
	for _, want := range []string{"missing column lease_key text", "column fence is integer, want bigint", "old_leases"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	var n int
	var created bool
	if err := conn.QueryRow(ctx, `SELECT count(*), to_regclass('old_leases_breaks') IS NOT NULL FROM old_leases WHERE fence = 41`).Scan(&n, &created); err != nil || n != 1 || created {
		t.Fatalf("the refused open changed something: rows %d, audit table created %v, %v", n, created, err)
	}
}

func TestTableParameterSeparatesStores(t *testing.T) {
	ctx := ctxT(t)
	a, b := open(t, "table=store_a"), open(t, "table=store_b")
	if a.Table() != "store_a" || b.Table() != "store_b" {
		t.Fatalf("tables %q, %q", a.Table(), b.Table())
	}
	if _, err := a.TryAcquire(ctx, "shared-name", "owner-a", 60e9); err != nil {
		t.Fatal(err)
	}
	if _, err := b.TryAcquire(ctx, "shared-name", "owner-b", 60e9); err != nil {
		t.Fatalf("a key held in table store_a blocks table store_b: %v", err)
	}
}
