package postgres_test

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/leasebench"
	"github.com/fenced-dev/fenced/postgres"
)

// benchClient opens a client over its own pool whose connections count
// round trips in rt (nil: not counted).
func benchClient(b *testing.B, rt *leasebench.RoundTrips, opts *fenced.Options, params ...string) *fenced.Client {
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
	return fenced.NewClient(d, opts)
}

// commitModes are the sessions' synchronous_commit settings the benchmarks
// run with: "on" is the durable default (every grant waits for its WAL
// flush); "off" shows what the statements cost without the disk.
var commitModes = []string{"on", "off"}

// BenchmarkAcquireRelease: uncontended TryAcquire + Release of one key.
func BenchmarkAcquireRelease(b *testing.B) {
	for _, mode := range commitModes {
		b.Run("synchronous_commit="+mode, func(b *testing.B) {
			var rt leasebench.RoundTrips
			c := benchClient(b, &rt, nil, "synchronous_commit="+mode)
			defer c.Close()
			leasebench.AcquireRelease(b, c, &rt)
		})
	}
}

// BenchmarkHandover: release to next grant with 1, 8 and 64 waiters woken
// by LISTEN/NOTIFY.
func BenchmarkHandover(b *testing.B) {
	for _, mode := range commitModes {
		for _, n := range []int{1, 8, 64} {
			b.Run(fmt.Sprintf("synchronous_commit=%s/waiters=%d", mode, n), func(b *testing.B) {
				leasebench.Handover(b, n, func(b *testing.B) *fenced.Client {
					return benchClient(b, nil, nil, "synchronous_commit="+mode)
				})
			})
		}
	}
}
