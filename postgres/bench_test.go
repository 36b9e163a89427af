package postgres_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/driver/drivertest"
	"github.com/fenced-dev/fenced/postgres"
)

// benchDriver opens a driver over its own pool whose connections count
// round trips in rt (nil: not counted).
func benchDriver(b *testing.B, rt *drivertest.RoundTrips, params ...string) driver.Driver {
	b.Helper()
	ctx := ctxT(b)
	cfg, err := pgxpool.ParseConfig(pg.URL(params...))
	if err != nil {
		b.Fatal(err)
	}
	if rt != nil {
		cfg.ConnConfig.DialFunc = rt.Dial
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	d, err := postgres.New(ctx, pool, nil)
	if err != nil {
		b.Fatal(err)
	}
	return d
}

// commitModes are the sessions' synchronous_commit settings the benchmarks
// run with: "on" is the durable default (every grant waits for its WAL
// flush); "off" shows what the statements cost without the disk.
var commitModes = []string{"on", "off"}

// BenchmarkLeases runs the shared benchmarks (drivertest.RunBenchmarks) in
// each commit mode; waiters are woken by LISTEN/NOTIFY.
func BenchmarkLeases(b *testing.B) {
	for _, mode := range commitModes {
		b.Run("synchronous_commit="+mode, func(b *testing.B) {
			drivertest.RunBenchmarks(b, drivertest.BenchHarness{
				Open: func(b *testing.B, rt *drivertest.RoundTrips) driver.Driver {
					return benchDriver(b, rt, "synchronous_commit="+mode)
				},
				CountsRoundTrips: true,
			})
		})
	}
}
