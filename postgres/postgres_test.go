package postgres_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/driver/drivertest"
	"github.com/fenced-dev/fenced/internal/crashtest"
	"github.com/fenced-dev/fenced/internal/testenv"
	"github.com/fenced-dev/fenced/postgres"
)

// pg is the server every test of the package shares, started once;
// mainTB owns it and whatever else is started once for the package.
var (
	pg     *testenv.Postgres
	mainTB *testenv.MainTB
)

func TestMain(m *testing.M) {
	crashtest.MaybeRunHolder()
	tb := testenv.NewMainTB()
	mainTB = tb
	pg = testenv.StartPostgres(tb)
	os.Setenv("DATABASE_URL", pg.URL()) // for the examples
	code := m.Run()
	tb.Close()
	os.Exit(code)
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func open(t testing.TB, params ...string) *postgres.Driver {
	t.Helper()
	d, err := postgres.Open(ctxT(t), pg.URL(params...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func TestConformance(t *testing.T) {
	drivertest.RunConformanceTests(t, drivertest.Harness{
		// Generous for a loaded CI machine: expiry tests sleep about this long.
		ShortTTL: time.Second,
		Open: func(t *testing.T) driver.Driver {
			d, err := postgres.Open(ctxT(t), pg.URL())
			if err != nil {
				t.Fatal(err)
			}
			return d
		},
		BadURLs: []string{
			"postgres://127.0.0.1:1/db?table=Bad-Name",
			"postgres://127.0.0.1:1/db?table=",
			"postgres://127.0.0.1:1/db?table=a;drop",
			"postgres://127.0.0.1:1/db?table=x&table=y",
			"postgresql://127.0.0.1:1/db?notify=maybe",
			"postgres://127.0.0.1:notaport/db",
			"postgres://127.0.0.1:1/db?sslmode=bogus",
		},
	})
}

func TestConformancePolling(t *testing.T) {
	drivertest.RunConformanceTests(t, drivertest.Harness{
		// Generous for a loaded CI machine: expiry tests sleep about this long.
		ShortTTL: time.Second,
		Open: func(t *testing.T) driver.Driver {
			d, err := postgres.Open(ctxT(t), pg.URL("notify=off", "table=polled_leases"))
			if err != nil {
				t.Fatal(err)
			}
			if d.Guarantees().Notify {
				t.Fatal("notify=off driver declares Notify")
			}
			return d
		},
	})
}

func TestKilledHolderIsReplaced(t *testing.T) {
	crashtest.KilledHolderIsReplaced(t, pg.URL())
}

func TestRestartKeepsFences(t *testing.T) {
	srv := testenv.StartPostgres(t)
	crashtest.RestartKeepsFences(t, srv, func(t *testing.T) driver.Driver {
		d, err := postgres.Open(ctxT(t), srv.URL())
		if err != nil {
			t.Fatal(err)
		}
		return d
	})
}
