package fencedpostgres_test

import (
	"os"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/drivertest"
	"github.com/fenced-dev/fenced/fencedpostgres"
	"github.com/fenced-dev/fenced/internal/testkit/crashtest"
	"github.com/fenced-dev/fenced/internal/testkit/opentest"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
	"github.com/fenced-dev/fenced/recipe/recipetest"
)

// pg is the server every test of the package shares, started once;
// mainTB owns it and whatever else is started once for the package.
var (
	pg     *testenv.Postgres
	mainTB *testenv.MainTB
)

func TestMain(m *testing.M) {
	crashtest.MaybeRunHolder()
	testenv.RunMain(m, func(tb *testenv.MainTB) {
		mainTB = tb
		pg = testenv.StartPostgres(tb)
		os.Setenv("DATABASE_URL", pg.URL()) // for the examples
	})
}

// ctxT is the context of a test: it ends with the test, or after two
// minutes.
var ctxT = opentest.Context

// open opens a driver on the shared server, closed when the test ends.
func open(t testing.TB, params ...string) *fencedpostgres.Driver {
	t.Helper()
	return opentest.Closed(t, fencedpostgres.Open, pg.URL(params...))
}

func TestConformance(t *testing.T) {
	h := drivertest.Harness{
		// Generous for a loaded CI machine: expiry tests sleep about this long.
		ShortTTL: time.Second,
		Open:     opentest.Opener(fencedpostgres.Open, pg.URL()),
		BadURLs: []string{
			"postgres://127.0.0.1:1/db?table=Bad-Name",
			"postgres://127.0.0.1:1/db?table=",
			"postgres://127.0.0.1:1/db?table=a;drop",
			"postgres://127.0.0.1:1/db?table=x&table=y",
			"postgresql://127.0.0.1:1/db?notify=maybe",
			"postgres://127.0.0.1:notaport/db",
			"postgres://127.0.0.1:1/db?sslmode=bogus",
			"postgres://127.0.0.1:1/db?tabel=x",
		},
	}
	drivertest.RunConformanceTests(t, h)
	recipetest.RunConformanceTests(t, h)
}

func TestKilledHolderIsReplaced(t *testing.T) {
	if testing.Short() {
		t.Skip("long: kill -9 of a holder process, waits out its TTL; run without -short")
	}
	t.Parallel() // waits on TTLs and restarts; independent of the other tests
	crashtest.KilledHolderIsReplaced(t, pg.URL())
}

func TestRestartKeepsFences(t *testing.T) {
	if testing.Short() {
		t.Skip("long: restarts the server; run without -short")
	}
	t.Parallel() // waits on TTLs and restarts; independent of the other tests
	srv := testenv.StartPostgres(t)
	crashtest.RestartKeepsFences(t, srv, opentest.Opener(fencedpostgres.Open, srv.URL()))
}

// A server that goes away and comes back: errors are actionable, the pool
// and the LISTEN connection recover, and releases wake waiters again.
func TestServerDownThenBack(t *testing.T) {
	if testing.Short() {
		t.Skip("long: stops and restarts the server; run without -short")
	}
	t.Parallel() // waits on TTLs and restarts; independent of the other tests
	ctx := ctxT(t)
	srv := testenv.StartPostgres(t)
	d, err := fencedpostgres.Open(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	crashtest.ServerDownThenBack(t, srv, d)
	other, err := fencedpostgres.Open(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	key := "down-then-back:notify"
	f, err := other.TryAcquire(ctx, key, "holder", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := d.Subscribe(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	// Wait until the waiting driver heads the key's line (holds its
	// advisory lock) and listens there, then release.
	deadline := time.Now().Add(time.Minute)
	for {
		var n int
		if err := other.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %'
 AND pid IN (SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted)`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d listening heads of a line a minute after the restart, want 1", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	signalled(sub.C(), 100*time.Millisecond) // the new head's own wake-up
	if err := other.Release(ctx, driver.Grant{Key: key, Owner: "holder", Fence: f}); err != nil {
		t.Fatal(err)
	}
	if !signalled(sub.C(), 10*time.Second) {
		t.Fatal("after the server came back, a release did not wake the waiter")
	}
}
