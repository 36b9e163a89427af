package fencedpostgres_test

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/fencedpostgres"
	"github.com/fenced-dev/fenced/internal/testkit/leasebench"
)

// benchDriver opens a driver over its own pool whose connections count
// round trips in rt (nil: not counted).
func benchDriver(b *testing.B, rt *leasebench.RoundTrips, params ...string) driver.Driver {
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
	d, err := fencedpostgres.New(ctx, pool, nil)
	if err != nil {
		b.Fatal(err)
	}
	return d
}

// commitModes are the sessions' synchronous_commit settings the benchmarks
// run with: "on" is the durable default (every grant waits for its WAL
// flush); "off" shows what the statements cost without the disk.
var commitModes = []string{"on", "off"}

// BenchmarkLeases runs the shared benchmarks (leasebench.Run) in
// each commit mode; waiters are woken by LISTEN/NOTIFY.
func BenchmarkLeases(b *testing.B) {
	for _, mode := range commitModes {
		b.Run("synchronous_commit="+mode, func(b *testing.B) {
			leasebench.Run(b, leasebench.Harness{
				Open: func(b *testing.B, rt *leasebench.RoundTrips) driver.Driver {
					return benchDriver(b, rt, "synchronous_commit="+mode)
				},
				CountsRoundTrips: true,
			})
		})
	}
}

// BenchmarkRenewalPeriod measures one renewal period of M leases held by
// one driver: a single RenewBatch of all M grants, as the Client's renewer
// hands a period's due leases to a driver.BatchRenewer. Each op is one
// period; it reports what the server counted per period
// (pg_stat_database's committed transactions: every statement outside a
// transaction is one) as stmts/period, the rows it updated
// (pg_stat_user_tables) as rows/period, the period's wall time, and
// lost/period, the grants the batch did not renew (must be 0). The grants
// are taken first, 64 at a time, with synchronous_commit off.
//
//	go test -run '^$' -bench RenewalPeriod -benchtime 5x ./fencedpostgres/
func BenchmarkRenewalPeriod(b *testing.B) {
	for _, m := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("M=%d", m), func(b *testing.B) {
			ctx := ctxT(b)
			d := benchDriver(b, nil, "synchronous_commit=off")
			br := d.(driver.BatchRenewer)
			grants := make([]driver.Grant, m)
			run := fmt.Sprintf("%x", rand.Uint64())
			var wg sync.WaitGroup
			errc := make(chan error, 64)
			for w := 0; w < 64; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := w; i < m; i += 64 {
						key := fmt.Sprintf("bench:renew:%s:%d", run, i)
						o := fmt.Sprintf("%016x%016x", rand.Uint64(), rand.Uint64())
						f, err := d.TryAcquire(ctx, key, o, time.Minute)
						if err != nil {
							errc <- err
							return
						}
						grants[i] = driver.Grant{Key: key, Owner: o, Fence: f, TTL: time.Minute}
					}
				}()
			}
			wg.Wait()
			close(errc)
			if err := <-errc; err != nil {
				b.Fatal(err)
			}
			probe, err := pgxpool.New(ctx, pg.URL())
			if err != nil {
				b.Fatal(err)
			}
			defer probe.Close()
			// counts returns the database's committed transactions and the
			// rows updated in the lease table, as flushed to the
			// statistics (the probe's own transactions are taken out by
			// reading twice). Other backends flush their counts when idle
			// for 10s (PGSTAT_IDLE_INTERVAL), so each measured read waits
			// that long first.
			counts := func() (xacts, rows int64) {
				if _, err := probe.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
					b.Fatal(err)
				}
				err := probe.QueryRow(ctx, `SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()),
  (SELECT COALESCE(sum(n_tup_upd), 0)::bigint FROM pg_stat_user_tables WHERE relname = 'fenced_leases')`).Scan(&xacts, &rows)
				if err != nil {
					b.Fatal(err)
				}
				return xacts, rows
			}
			time.Sleep(11 * time.Second)
			x0, _ := counts()
			x1, r1 := counts()
			probeXacts := x1 - x0 // what one counts() costs
			lost := 0
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				errs, err := br.RenewBatch(ctx, grants)
				if err != nil {
					b.Fatal(err)
				}
				for _, e := range errs {
					if e != nil {
						lost++
					}
				}
			}
			took := time.Since(start)
			b.StopTimer()
			time.Sleep(11 * time.Second)
			x2, r2 := counts()
			b.ReportMetric(float64(x2-x1-probeXacts)/float64(b.N), "stmts/period")
			b.ReportMetric(float64(r2-r1)/float64(b.N), "rows/period")
			b.ReportMetric(float64(lost)/float64(b.N), "lost/period")
			b.ReportMetric(float64(took.Milliseconds())/float64(b.N), "ms/period")
		})
	}
}
