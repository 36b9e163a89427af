// Package consensus benchmarks fenced's etcd and ZooKeeper backends side by
// side with etcd's concurrency.Mutex and go-zookeeper's Lock, against real
// servers started by the benchmark.
//
//	go test -bench . -benchtime 200x
//
// Uncontended reports one acquire+release per op; HandoverN has N waiters
// queued and reports the latency from the holder's release call to the
// next holder's acquire returning (p50/p99 over all handovers). The
// implementations run in alternating rounds of 20 operations, so load from
// elsewhere on the machine hits them alike; each reports <name>-p50-µs and
// <name>-p99-µs, and fenced/<name>-p50-ratio compares fenced with each.
// "driver" is fenced's driver called directly (driver.TimedQueuer and Release),
// without the portable Client, to show what the Client costs.
package consensus

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/fenced-dev/fenced"
	_ "github.com/fenced-dev/fenced/fencedetcd"
	_ "github.com/fenced-dev/fenced/fencedzookeeper"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

type locker interface {
	Lock(ctx context.Context) error
	Unlock(ctx context.Context) error
}

// newLocker returns a locker on its own connection for key.
type newLocker func(b *testing.B, key string) locker

type fencedLocker struct {
	c *fenced.Client
	k string
	l *fenced.Lease
}

func (f *fencedLocker) Lock(ctx context.Context) (err error) {
	f.l, err = f.c.Acquire(ctx, f.k, &fenced.LeaseOptions{TTL: 10 * time.Second, MaxWait: fenced.WaitForever})
	return err
}
func (f *fencedLocker) Unlock(ctx context.Context) error { return f.l.Release(ctx) }

func fencedFactory(url string) newLocker {
	return func(b *testing.B, key string) locker {
		c, err := fenced.Open(context.Background(), url, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		return &fencedLocker{c: c, k: key}
	}
}

type etcdMutex struct{ m *concurrency.Mutex }

func (e etcdMutex) Lock(ctx context.Context) error   { return e.m.Lock(ctx) }
func (e etcdMutex) Unlock(ctx context.Context) error { return e.m.Unlock(ctx) }

func etcdFactory(eps []string) newLocker {
	return func(b *testing.B, key string) locker {
		cli, err := clientv3.New(clientv3.Config{Endpoints: eps, Logger: zap.NewNop()})
		if err != nil {
			b.Fatal(err)
		}
		s, err := concurrency.NewSession(cli, concurrency.WithTTL(10))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close(); cli.Close() })
		return etcdMutex{concurrency.NewMutex(s, "fenced/"+key)}
	}
}

type zkLock struct{ l *zk.Lock }

func (z zkLock) Lock(context.Context) error   { return z.l.Lock() }
func (z zkLock) Unlock(context.Context) error { return z.l.Unlock() }

func zkFactory(servers []string) newLocker {
	return func(b *testing.B, key string) locker {
		conn, _, err := zk.Connect(servers, 10*time.Second, zk.WithLogInfo(false))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(conn.Close)
		return zkLock{zk.NewLock(conn, "/gozk/"+key, zk.WorldACL(zk.PermAll))}
	}
}

// impl is one lock implementation under comparison.
type impl struct {
	name string
	nl   newLocker
}

// round is how many operations one implementation runs before the next
// takes its turn: implementations alternate in rounds so that load from
// elsewhere on the machine hits them alike.
const round = 20

// uncontended runs ops acquire+release pairs on one locker and returns
// their latencies.
func uncontended(b *testing.B, l locker, ops int) []time.Duration {
	ctx := context.Background()
	lat := make([]time.Duration, 0, ops)
	for i := 0; i < ops; i++ {
		t0 := time.Now()
		if err := l.Lock(ctx); err != nil {
			b.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	return lat
}

// handover has all lockers (one holder, the rest waiters) contend until ops
// acquisitions have happened, and returns the latency of each handover:
// from the previous holder's release call to the next holder's acquire
// returning.
func handover(b *testing.B, ls []locker, ops int) []time.Duration {
	ctx := context.Background()
	var (
		mu         sync.Mutex
		releasedAt time.Time
		lat        []time.Duration
		left       = ops
		wg         sync.WaitGroup
	)
	for _, l := range ls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				if err := l.Lock(ctx); err != nil {
					b.Error(err)
					return
				}
				mu.Lock()
				if !releasedAt.IsZero() {
					lat = append(lat, time.Since(releasedAt))
				}
				left--
				done := left <= 0
				releasedAt = time.Now()
				mu.Unlock()
				if err := l.Unlock(ctx); err != nil {
					b.Error(err)
					return
				}
				if done {
					return
				}
			}
		}()
	}
	wg.Wait()
	// Waiters still queued when the count ran out hold once more each;
	// drop those tail samples' effect by counting only the first ops-1.
	if len(lat) > ops-1 {
		lat = lat[:ops-1]
	}
	return lat
}

// compare runs each implementation b.N times in alternating rounds and
// reports p50/p99 per implementation and the p50 ratio of the first to
// each other one.
func compare(b *testing.B, impls []impl, waiters int) {
	lockers := make([][]locker, len(impls))
	for i, im := range impls {
		key := fmt.Sprintf("k%d-%d", waiters, time.Now().UnixNano())
		for j := 0; j <= waiters; j++ {
			lockers[i] = append(lockers[i], im.nl(b, key))
		}
		uncontended(b, lockers[i][0], 2) // warm up: sessions, parents
	}
	lat := make([][]time.Duration, len(impls))
	b.ResetTimer()
	for done := 0; done < b.N; done += round {
		n := min(round, b.N-done)
		for i := range impls {
			if waiters == 0 {
				lat[i] = append(lat[i], uncontended(b, lockers[i][0], n)...)
			} else {
				lat[i] = append(lat[i], handover(b, lockers[i], n+1)...)
			}
		}
	}
	b.StopTimer()
	var p50s []float64
	for i, im := range impls {
		l := lat[i]
		sort.Slice(l, func(a, c int) bool { return l[a] < l[c] })
		p50, p99 := l[len(l)/2], l[len(l)*99/100]
		p50s = append(p50s, float64(p50.Microseconds()))
		b.ReportMetric(float64(p50.Microseconds()), im.name+"-p50-µs")
		b.ReportMetric(float64(p99.Microseconds()), im.name+"-p99-µs")
	}
	for i := 1; i < len(impls); i++ {
		b.ReportMetric(p50s[0]/p50s[i], impls[0].name+"/"+impls[i].name+"-p50-ratio")
	}
	b.ReportMetric(0, "ns/op")
}

func run(b *testing.B, impls []impl) {
	b.Run("Uncontended", func(b *testing.B) { compare(b, impls, 0) })
	for _, w := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("Handover%d", w), func(b *testing.B) { compare(b, impls, w) })
	}
}

func BenchmarkEtcd(b *testing.B) {
	cluster := testenv.StartEtcd(b)
	impls := []impl{
		{"fenced", fencedFactory(cluster.URL(""))},
		{"concurrency.Mutex", etcdFactory(cluster.Endpoints())},
		{"driver", driverFactory(cluster.URL(""))},
	}
	run(b, impls)
}

func BenchmarkZooKeeper(b *testing.B) {
	ens := testenv.StartZooKeeper(b)
	impls := []impl{
		{"fenced", fencedFactory(ens.URL("/bench", ""))},
		{"zk.Lock", zkFactory(ens.Servers())},
		{"driver", driverFactory(ens.URL("/bench", ""))},
	}
	run(b, impls)
}
