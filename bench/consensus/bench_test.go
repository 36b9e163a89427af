// Package consensus benchmarks fenced's etcd and ZooKeeper backends side by
// side with etcd's concurrency.Mutex and go-zookeeper's Lock, against real
// servers started by the benchmark.
//
//	go test -bench . -benchtime 200x
//
// Uncontended reports one acquire+release per op; HandoverN has N waiters
// queued and reports the latency from the holder's release call to the
// next holder's acquire returning (p50/p99 over all handovers).
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
	_ "github.com/fenced-dev/fenced/etcd"
	"github.com/fenced-dev/fenced/internal/testenv"
	_ "github.com/fenced-dev/fenced/zookeeper"
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

func benchUncontended(b *testing.B, nl newLocker) {
	ctx := context.Background()
	l := nl(b, fmt.Sprintf("u%d", time.Now().UnixNano()))
	if err := l.Lock(ctx); err != nil { // warm up: sessions, parents
		b.Fatal(err)
	}
	if err := l.Unlock(ctx); err != nil {
		b.Fatal(err)
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if err := l.Lock(ctx); err != nil {
			b.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	report(b, lat)
}

// benchHandover runs waiters+1 contenders; every acquisition after the
// first is a handover, timed from the previous holder's release call.
func benchHandover(b *testing.B, nl newLocker, waiters int) {
	ctx := context.Background()
	key := fmt.Sprintf("h%d", time.Now().UnixNano())
	ls := make([]locker, waiters+1)
	for i := range ls {
		ls[i] = nl(b, key)
	}
	var (
		mu         sync.Mutex
		releasedAt time.Time
		lat        []time.Duration
		left       = b.N
		wg         sync.WaitGroup
	)
	b.ResetTimer()
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
				done := left <= 0
				left--
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
	report(b, lat)
}

func report(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

func BenchmarkEtcd(b *testing.B) {
	cluster := testenv.StartEtcd(b)
	impls := []struct {
		name string
		nl   newLocker
	}{
		{"fenced", fencedFactory(cluster.URL(""))},
		{"concurrency.Mutex", etcdFactory(cluster.Endpoints())},
	}
	run(b, impls)
}

func BenchmarkZooKeeper(b *testing.B) {
	ens := testenv.StartZooKeeper(b)
	impls := []struct {
		name string
		nl   newLocker
	}{
		{"fenced", fencedFactory(ens.URL("/bench", ""))},
		{"zk.Lock", zkFactory(ens.Servers())},
	}
	run(b, impls)
}

func run(b *testing.B, impls []struct {
	name string
	nl   newLocker
}) {
	for _, im := range impls {
		b.Run("Uncontended/"+im.name, func(b *testing.B) { benchUncontended(b, im.nl) })
	}
	for _, w := range []int{1, 8, 64} {
		for _, im := range impls {
			b.Run(fmt.Sprintf("Handover%d/%s", w, im.name), func(b *testing.B) { benchHandover(b, im.nl, w) })
		}
	}
}
