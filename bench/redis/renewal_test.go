package redisbench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/fencedredis"
)

// BenchmarkRenewalPeriod measures one renewal period of M leases held by
// one driver: a single RenewBatch of all M grants, as the Client's renewer
// hands a period's due leases to a driver.BatchRenewer. Each op is one
// period; it reports what the server ran per period (INFO commandstats):
// scripts/period (script calls, the requests that reach the single
// thread) and srvcmds/period (commands those scripts ran), the period's
// wall time, how long the server spent in the scripts (script-ms/period,
// and µs/script: how long one call keeps the single thread from other
// clients), and lost/period, the grants the batch did not renew (must be
// 0). The M grants are taken first with 64 in flight.
//
//	cd bench/redis && go test -run '^$' -bench RenewalPeriod -benchtime 5x
func BenchmarkRenewalPeriod(b *testing.B) {
	srv := startServer(b)
	for _, m := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("M=%d", m), func(b *testing.B) {
			ctx := context.Background()
			c, _ := newClient(b, srv)
			d, err := fencedredis.New(c, nil)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { d.Close() })
			grants := holdMany(b, d, m, time.Minute)
			// Load the script outside the measurement.
			if _, err := d.RenewBatch(ctx, grants[:1]); err != nil {
				b.Fatal(err)
			}
			before := readServerCalls(b, c)
			busy := scriptMicros(b, c)
			lost := 0
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				start := time.Now()
				errs, err := d.RenewBatch(ctx, grants)
				if err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
				for _, e := range errs {
					if e != nil {
						lost++
					}
				}
			}
			b.StopTimer()
			busy = scriptMicros(b, c) - busy
			served := readServerCalls(b, c).since(before)
			served.report(b, b.N, "period")
			b.ReportMetric(float64(busy)/float64(b.N)/1000, "script-ms/period")
			b.ReportMetric(float64(busy)/float64(max(served.scripts(), 1)), "µs/script")
			b.ReportMetric(float64(lost)/float64(b.N), "lost/period")
			reportPercentiles(b, lat, "period")
			b.Logf("server, %d periods of %d leases: %v", b.N, m, served)
		})
	}
}

// holdMany takes m fresh keys through d, 64 at a time.
func holdMany(b *testing.B, d *fencedredis.Driver, m int, ttl time.Duration) []driver.Grant {
	b.Helper()
	ctx := context.Background()
	run := rand.Uint64()
	grants := make([]driver.Grant, m)
	var wg sync.WaitGroup
	errc := make(chan error, 64)
	for w := 0; w < 64; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < m; i += 64 {
				key := fmt.Sprintf("bench:renew:%x:%d", run, i)
				o := fmt.Sprintf("%016x%016x", rand.Uint64(), rand.Uint64())
				f, err := d.TryAcquire(ctx, key, o, ttl)
				if err != nil {
					errc <- err
					return
				}
				grants[i] = driver.Grant{Key: key, Owner: o, Fence: f, TTL: ttl}
			}
		}()
	}
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
	return grants
}
