package fencedpostgres_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedpostgres"
	"github.com/fenced-dev/fenced/internal/testkit/opentest"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// TestOpenErrorsNameTheProblem: a refused open matches the sentinel,
// says what was wrong and reveals no password.
func TestOpenErrorsNameTheProblem(t *testing.T) {
	const badPassword = "not-the-Password-42"
	opentest.Refused(t, []opentest.Refusal{
		{Name: "wrong password", URL: pg.URLAs(pg.User, badPassword), Want: fenced.ErrUnavailable, Says: "authentication failed"},
		{Name: "unknown user", URL: pg.URLAs("nobody_here", badPassword), Want: fenced.ErrUnavailable, Says: "authentication failed"},
		{Name: "unreachable server", URL: "postgres://fenced:" + badPassword + "@" + testenv.Addr(testenv.FreePort(t)) + "/postgres?sslmode=disable&connect_timeout=5", Want: fenced.ErrUnavailable, Says: "cannot connect"},
		{Name: "bad table name", URL: pg.URL("table=Robert');DROP"), Want: fenced.ErrInvalidURL, Says: ""},
		{Name: "upper-case table name", URL: pg.URL("table=Leases"), Want: fenced.ErrInvalidURL, Says: "table name"},
		{Name: "overlong table name", URL: pg.URL("table=" + strings.Repeat("t", 49)), Want: fenced.ErrInvalidURL, Says: "longer than 48"},
		{Name: "bad pgx parameter", URL: "postgres://fenced:" + badPassword + "@127.0.0.1:1/db?sslmode=sometimes", Want: fenced.ErrInvalidURL, Says: "sslmode"},
		{Name: "password in the query", URL: "postgres://127.0.0.1:1/db?password=" + badPassword + "&sslmode=sometimes", Want: fenced.ErrInvalidURL, Says: "sslmode"},
	}, badPassword, pg.Password)
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
