package fencedmysql_test

import (
	"os"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/drivertest"
	"github.com/fenced-dev/fenced/fencedmysql"
	"github.com/fenced-dev/fenced/internal/testkit/crashtest"
	"github.com/fenced-dev/fenced/internal/testkit/opentest"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
	"github.com/fenced-dev/fenced/recipe/recipetest"
)

// my is the server every test of the package shares, started once.
var my *testenv.MySQL

func TestMain(m *testing.M) {
	crashtest.MaybeRunHolder()
	maybeRunBellHolder()
	testenv.RunMain(m, func(tb *testenv.MainTB) {
		my = testenv.StartMySQL(tb)
		os.Setenv("DATABASE_URL", my.URL()) // for the examples
		os.Setenv("MYSQL_DSN", my.DSN())
	})
}

// ctxT is the context of a test: it ends with the test, or after two
// minutes.
var ctxT = opentest.Context

// open opens a driver on the shared server, closed when the test ends.
func open(t testing.TB, params ...string) *fencedmysql.Driver {
	t.Helper()
	return opentest.Closed(t, fencedmysql.Open, my.URL(params...))
}

func TestConformance(t *testing.T) {
	h := drivertest.Harness{
		// Generous for a loaded CI machine: expiry tests sleep about this long.
		ShortTTL: time.Second,
		Open:     opentest.Opener(fencedmysql.Open, my.URL()),
		BadURLs: []string{
			"mysql://127.0.0.1:1/db?table=Bad-Name",
			"mysql://127.0.0.1:1/db?table=",
			"mysql://127.0.0.1:1/db?table=a;drop",
			"mysql://127.0.0.1:1/db?table=x&table=y",
			"mysql://127.0.0.1:1/",
			"mysql://127.0.0.1:1/a/b",
			"mysql:///db",
			"mysql://127.0.0.1:notaport/db",
			"mysql://127.0.0.1:1/db?timeout=forever",
			"mysql://127.0.0.1:1/db?tls=nosuchconfig",
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
	crashtest.KilledHolderIsReplaced(t, my.URL())
}

func TestRestartKeepsFences(t *testing.T) {
	if testing.Short() {
		t.Skip("long: restarts the server; run without -short")
	}
	t.Parallel() // waits on TTLs and restarts; independent of the other tests
	srv := testenv.StartMySQL(t)
	crashtest.RestartKeepsFences(t, srv, opentest.Opener(fencedmysql.Open, srv.URL()))
}

// A server that goes away and comes back: errors are actionable and the
// driver recovers.
func TestServerDownThenBack(t *testing.T) {
	if testing.Short() {
		t.Skip("long: stops and restarts the server; run without -short")
	}
	t.Parallel() // waits on TTLs and restarts; independent of the other tests
	srv := testenv.StartMySQL(t)
	crashtest.ServerDownThenBack(t, srv, opentest.Closed(t, fencedmysql.Open, srv.URL()))
}
