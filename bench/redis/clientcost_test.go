package redisbench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedredis"
	"github.com/redis/go-redis/v9"
)

// fencedDefaultsLocker acquires with the package defaults (no wait,
// automatic renewal, so every grant is registered with the renewer), with
// MinFence FenceRepeatable, the strongest fence single-node Redis has.
type fencedDefaultsLocker struct{ c *fenced.Client }

func (l fencedDefaultsLocker) lock(ctx context.Context, key string) (func(context.Context) error, error) {
	lease, err := l.c.Acquire(ctx, key, &fenced.LeaseOptions{TTL: 10 * time.Second, MinFence: fenced.FenceRepeatable})
	if err != nil {
		return nil, err
	}
	return lease.Release, nil
}

// BenchmarkClientCost measures what fenced's portable Client costs over
// its Redis driver on the uncontended acquire+release path: one loop runs
// the driver alone, the Client (the bench's wait/no-renew shape and the
// renewing defaults) and redislock in turn, in shuffled order, each on its
// own key and go-redis client, after a discarded warm-up, and reports each
// one's p50 and p99, the Client's p50 over the driver's, and the median
// over rounds of the Client's time minus the driver's in the same round
// (over-driver-paired, the steadiest figure on a loaded machine).
//
//	cd bench/redis && FENCED_BENCH_AOF=0 go test -run XXX -bench ClientCost -benchtime 3000x
func BenchmarkClientCost(b *testing.B) {
	ctx := context.Background()
	srv := startServer(b)
	type impl struct {
		name string
		l    locker
		key  string
		lat  []time.Duration
	}
	newDriver := func(c *redis.Client) *fencedredis.Driver {
		d, err := fencedredis.New(c, nil)
		if err != nil {
			b.Fatal(err)
		}
		return d
	}
	var impls []*impl
	add := func(name string, l locker) {
		impls = append(impls, &impl{name: name, l: l, key: fmt.Sprintf("bench:cost:%s:%d", name, keySeq.Add(1))})
	}
	{
		c, _ := newClient(b, srv)
		d := newDriver(c)
		b.Cleanup(func() { d.Close() })
		add("fenced-driver", driverLocker{d})
	}
	{
		c, _ := newClient(b, srv)
		fc := fenced.NewClient(newDriver(c), nil)
		b.Cleanup(func() { fc.Close() })
		add("fenced", fencedLocker{fc})
	}
	{
		c, _ := newClient(b, srv)
		fc := fenced.NewClient(newDriver(c), nil)
		b.Cleanup(func() { fc.Close() })
		add("fenced-defaults", fencedDefaultsLocker{fc})
	}
	{
		c, _ := newClient(b, srv)
		add("redislock", redislockLocker{redislock.New(c), func() redislock.RetryStrategy { return redislock.LinearBackoff(10 * time.Millisecond) }})
	}
	pair := func(im *impl) time.Duration {
		start := time.Now()
		unlock, err := im.l.lock(ctx, im.key)
		if err != nil {
			b.Fatal(err)
		}
		if err := unlock(ctx); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	order := make([]*impl, len(impls))
	copy(order, impls)
	for i := 0; i < 100; i++ { // warm-up: connections, script cache; discarded
		for _, im := range impls {
			pair(im)
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		rand.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, im := range order {
			im.lat = append(im.lat, pair(im))
		}
	}
	b.StopTimer()
	var driverP50 float64
	for _, im := range impls {
		p50, p99 := quantileUS(im.lat, 0.50), quantileUS(im.lat, 0.99)
		if im.name == "fenced-driver" {
			driverP50 = p50
		}
		b.ReportMetric(p50, im.name+"-p50-µs")
		b.ReportMetric(p99, im.name+"-p99-µs")
	}
	// The paired figure: the median over rounds of the Client's time minus
	// the driver's in the same round, which cancels the load both saw.
	for _, im := range impls {
		if im.name == "fenced" || im.name == "fenced-defaults" {
			b.ReportMetric(quantileUS(im.lat, 0.50)-driverP50, im.name+"-over-driver-p50-µs")
			diffs := make([]time.Duration, len(im.lat))
			for i := range diffs {
				diffs[i] = im.lat[i] - impls[0].lat[i]
			}
			b.ReportMetric(quantileUS(diffs, 0.50), im.name+"-over-driver-paired-µs")
		}
	}
	b.ReportMetric(0, "ns/op")
}

func quantileUS(lat []time.Duration, q float64) float64 {
	s := slices.Clone(lat)
	slices.Sort(s)
	return float64(s[int(q*float64(len(s)-1))].Nanoseconds()) / 1e3
}
