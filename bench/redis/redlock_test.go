package redisbench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedredlock"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
)

// BenchmarkRedlock: acquire+release over 5 nodes, and handover with 8
// waiters, fenced's redlock (no fence source, efficiency leases) against
// redsync with 5 pools. Trips count requests to all nodes together (5 per
// parallel round).
func BenchmarkRedlock(b *testing.B) {
	ctx := context.Background()
	var srvs []*testenv.Redis
	for i := 0; i < 5; i++ {
		srvs = append(srvs, startServer(b))
	}
	clients := func(b *testing.B) ([]*redis.Client, *counter) {
		h := &counter{}
		var cs []*redis.Client
		for _, s := range srvs {
			c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, ContextTimeoutEnabled: true})
			c.AddHook(h)
			b.Cleanup(func() { c.Close() })
			cs = append(cs, c)
		}
		return cs, h
	}
	rl := func(b *testing.B) (locker, *counter) {
		cs, h := clients(b)
		var ucs []redis.UniversalClient
		for _, c := range cs {
			ucs = append(ucs, c)
		}
		d, err := fencedredlock.New(ucs, nil)
		if err != nil {
			b.Fatal(err)
		}
		fc := fenced.NewClient(d, nil)
		b.Cleanup(func() { fc.Close() })
		return fencedLocker{fc}, h
	}
	rs := func(b *testing.B) (locker, *counter) {
		cs, h := clients(b)
		var pools []redsyncredis.Pool
		for _, c := range cs {
			pools = append(pools, goredis.NewPool(c))
		}
		return redsyncLocker{redsync.New(pools...)}, h
	}
	run := func(b *testing.B, h *counter, l locker) {
		key := fmt.Sprintf("bench:rl:%d", keySeq.Add(1))
		for i := 0; i < 10; i++ {
			unlock, err := l.lock(ctx, key)
			if err != nil {
				b.Fatal(err)
			}
			unlock(ctx)
		}
		lat := make([]time.Duration, 0, b.N)
		before := h.trips.Load()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			start := time.Now()
			unlock, err := l.lock(ctx, key)
			if err != nil {
				b.Fatal(err)
			}
			if err := unlock(ctx); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
		}
		b.StopTimer()
		b.ReportMetric(float64(h.trips.Load()-before)/float64(b.N), "trips/op")
		reportPercentiles(b, lat, "pair")
	}
	b.Run("uncontended/fenced-redlock", func(b *testing.B) { l, h := rl(b); run(b, h, l) })
	b.Run("uncontended/redsync", func(b *testing.B) { l, h := rs(b); run(b, h, l) })
	b.Run("handover-8-waiters/fenced-redlock", func(b *testing.B) { l, h := rl(b); handover(b, h, l, 8) })
	b.Run("handover-8-waiters/redsync", func(b *testing.B) { l, h := rs(b); handover(b, h, l, 8) })
}
