package fencedmysql_test

import (
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedmysql"
	"github.com/fenced-dev/fenced/internal/testkit/opentest"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// TestOpenErrorsNameTheProblem: a refused open matches the sentinel,
// says what was wrong and reveals no password.
func TestOpenErrorsNameTheProblem(t *testing.T) {
	const badPassword = "not-the-Password-42"
	opentest.Refused(t, []opentest.Refusal{
		{Name: "wrong password", URL: my.URLAs(my.User, badPassword), Want: fenced.ErrUnavailable, Says: "access denied"},
		{Name: "unknown user", URL: my.URLAs("nobody_here", badPassword), Want: fenced.ErrUnavailable, Says: "access denied"},
		{Name: "unreachable server", URL: "mysql://fenced:" + badPassword + "@" + testenv.Addr(testenv.FreePort(t)) + "/fenced", Want: fenced.ErrUnavailable, Says: "cannot connect"},
		{Name: "bad table name", URL: my.URL("table=Robert`;DROP"), Want: fenced.ErrInvalidURL, Says: ""},
		{Name: "upper-case table name", URL: my.URL("table=Leases"), Want: fenced.ErrInvalidURL, Says: "table name"},
		{Name: "no database", URL: "mysql://fenced:" + badPassword + "@127.0.0.1:1/", Want: fenced.ErrInvalidURL, Says: "database"},
		{Name: "bad driver parameter", URL: "mysql://fenced:" + badPassword + "@127.0.0.1:1/db?readTimeout=soon", Want: fenced.ErrInvalidURL, Says: "readTimeout"},
	}, badPassword, my.Password)
}

func TestOldShapeTableIsRefused(t *testing.T) {
	ctx := ctxT(t)
	db, err := sql.Open("mysql", my.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, q := range []string{
		"DROP TABLE IF EXISTS old_leases, old_leases_breaks",
		"CREATE TABLE old_leases (lock_key VARCHAR(255) PRIMARY KEY, owner VARCHAR(255) NOT NULL, fence INT NOT NULL, expires_at DATETIME NOT NULL)",
		"INSERT INTO old_leases VALUES ('k', 'someone', 41, NOW() + INTERVAL 1 HOUR)",
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	_, err = fencedmysql.Open(ctx, my.URL("table=old_leases"))
	if !errors.Is(err, fencedmysql.ErrSchema) {
		t.Fatalf("Open over an old-shape table: %v, want ErrSchema", err)
	}
	for _, want := range []string{"missing column lease_key varbinary", "column fence is int, want bigint", "old_leases"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	var n, audit int
	if err := db.QueryRowContext(ctx, "SELECT (SELECT COUNT(*) FROM old_leases WHERE fence = 41), (SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = 'old_leases_breaks')").Scan(&n, &audit); err != nil || n != 1 || audit != 0 {
		t.Fatalf("the refused open changed something: rows %d, audit tables %d, %v", n, audit, err)
	}
}

// The typed constructor works over a caller's *sql.DB whatever its
// settings: no interpolation, no parseTime, clientFoundRows on.
func TestNewOverCallersDB(t *testing.T) {
	ctx := ctxT(t)
	db, err := sql.Open("mysql", my.DSN()+"?clientFoundRows=true")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	d, err := fencedmysql.New(ctx, db, &fencedmysql.Options{Table: "callers_leases"})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	key := fmt.Sprintf("callers:%s:%d", t.Name(), time.Now().UnixNano())
	f, err := d.TryAcquire(ctx, key, "a", time.Minute)
	if err != nil || f != 1 {
		t.Fatalf("first grant: %d, %v", f, err)
	}
	// With clientFoundRows an unchanged row counts as affected; the driver
	// must still see the refusal.
	_, err = d.TryAcquire(ctx, key, "b", time.Minute)
	var held *fenced.HeldError
	if !errors.As(err, &held) || held.Remaining <= 0 || held.Remaining > time.Minute {
		t.Fatalf("acquire by another owner: %v, want a HeldError with the time left", err)
	}
	if f2, err := d.TryAcquire(ctx, key, "a", time.Minute); err != nil || f2 != f {
		t.Fatalf("re-acquire by the holder: %d, %v; want %d", f2, err, f)
	}
	if _, err := d.Break(ctx, key, "test", t.Name()); err != nil {
		t.Fatal(err)
	}
	recs, err := d.Breaks(ctx, key)
	if err != nil || len(recs) != 1 || time.Since(recs[0].Time).Abs() > time.Minute {
		t.Fatalf("breaks = %+v, %v; want one, timed now", recs, err)
	}
}
