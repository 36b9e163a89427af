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
func benchClient(b *testing.B, rt *leasebench.RoundTrips, opts *fenced.Options) *fenced.Client {
	b.Helper()
	ctx := ctxT(b)
	cfg, err := pgxpool.ParseConfig(pg.URL())
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

// BenchmarkAcquireRelease: uncontended TryAcquire + Release of one key.
func BenchmarkAcquireRelease(b *testing.B) {
	var rt leasebench.RoundTrips
	c := benchClient(b, &rt, nil)
	defer c.Close()
	leasebench.AcquireRelease(b, c, &rt)
}

// BenchmarkHandover: release to next grant with 1, 8 and 64 waiters woken
// by LISTEN/NOTIFY.
func BenchmarkHandover(b *testing.B) {
	for _, n := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("waiters=%d", n), func(b *testing.B) {
			leasebench.Handover(b, n, func(b *testing.B) *fenced.Client { return benchClient(b, nil, nil) })
		})
	}
}
