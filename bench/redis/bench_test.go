// Package redisbench compares fenced's Redis backends with redsync and
// redislock against real redis-servers, in the same run.
//
//	cd bench/redis && FENCED_BENCH_AOF=0 go test -run XXX -bench . -benchtime 200x
//	cd bench/redis && go test -run XXX -bench . -benchtime 200x   # appendfsync always
//
// Uncontended reports round trips per acquire+release pair (a go-redis hook
// counts every command, and every pipeline as one) and what the server
// executed per pair, from INFO commandstats: srvcmds (data commands, those
// scripts ran included) and scripts (script calls). Handover reports the
// time from the holder starting its release to the next holder's acquire
// returning, p50 and p99, with 1, 8 and 64 waiters; a releaser waits until
// someone else got the lock before contending again, so each sample is a
// real handover to a waiting goroutine. All goroutines of a library share
// one go-redis client, as goroutines of one process would. Wake isolates
// the notification path and the idle round-trip floor; Ping is the
// back-to-back floor. Redlock runs 5 servers.
package redisbench

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/fencedredis"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
)

// counter counts round trips: a single command or a whole pipeline is one.
type counter struct{ trips atomic.Int64 }

func (h *counter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.trips.Add(1)
		return next(ctx, cmd)
	}
}
func (h *counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.trips.Add(1)
		return next(ctx, cmds)
	}
}

func newClient(b *testing.B, srv *testenv.Redis) (*redis.Client, *counter) {
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, PoolSize: 128})
	h := &counter{}
	c.AddHook(h)
	b.Cleanup(func() { c.Close() })
	return c, h
}

// startServer starts a redis-server with the append-only file fsynced on
// every write, as fenced recommends; FENCED_BENCH_AOF=0 turns persistence
// off to compare with figures taken without it.
func startServer(b *testing.B) *testenv.Redis {
	return testenv.StartRedis(b, testenv.RedisConfig{NoPersistence: os.Getenv("FENCED_BENCH_AOF") == "0"})
}

// locker is what each library offers, reduced to blocking acquire and
// release.
type locker interface {
	lock(ctx context.Context, key string) (unlock func(context.Context) error, err error)
}

type fencedLocker struct{ c *fenced.Client }

func (l fencedLocker) lock(ctx context.Context, key string) (func(context.Context) error, error) {
	lease, err := l.c.Acquire(ctx, key, &fenced.LeaseOptions{TTL: 10 * time.Second, MaxWait: fenced.WaitForever, MinFence: fenced.FenceNone, ManualRenew: true})
	if err != nil {
		return nil, err
	}
	return lease.Release, nil
}

// driverLocker calls the fenced driver directly, without the portable
// Client (no lease object, no renewal, no hooks): the cost of the scripts
// alone.
type driverLocker struct{ d *fencedredis.Driver }

func (l driverLocker) lock(ctx context.Context, key string) (func(context.Context) error, error) {
	owner := fmt.Sprintf("%016x%016x", rand.Uint64(), rand.Uint64())
	f, err := l.d.TryAcquire(ctx, key, owner, 10*time.Second)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		return l.d.Release(ctx, driver.Grant{Key: key, Owner: owner, Fence: f})
	}, nil
}

type redsyncLocker struct{ rs *redsync.Redsync }

func (l redsyncLocker) lock(ctx context.Context, key string) (func(context.Context) error, error) {
	m := l.rs.NewMutex(key, redsync.WithExpiry(10*time.Second), redsync.WithTries(math.MaxInt32))
	if err := m.LockContext(ctx); err != nil {
		return nil, err
	}
	return func(ctx context.Context) error { _, err := m.UnlockContext(ctx); return err }, nil
}

type redislockLocker struct {
	c     *redislock.Client
	retry func() redislock.RetryStrategy
}

func (l redislockLocker) lock(ctx context.Context, key string) (func(context.Context) error, error) {
	lk, err := l.c.Obtain(ctx, key, 10*time.Second, &redislock.Options{RetryStrategy: l.retry()})
	if err != nil {
		return nil, err
	}
	return lk.Release, nil
}

type contender struct {
	name string
	make func(b *testing.B, c *redis.Client) locker
}

var contenders = []contender{
	{"fenced", func(b *testing.B, c *redis.Client) locker {
		d, err := fencedredis.New(c, nil)
		if err != nil {
			b.Fatal(err)
		}
		fc := fenced.NewClient(d, nil)
		b.Cleanup(func() { fc.Close() })
		return fencedLocker{fc}
	}},
	{"redsync", func(b *testing.B, c *redis.Client) locker {
		return redsyncLocker{redsync.New(goredis.NewPool(c))}
	}},
	{"redislock-linear10ms", func(b *testing.B, c *redis.Client) locker {
		return redislockLocker{redislock.New(c), func() redislock.RetryStrategy { return redislock.LinearBackoff(10 * time.Millisecond) }}
	}},
	{"redislock-exp1-64ms", func(b *testing.B, c *redis.Client) locker {
		return redislockLocker{redislock.New(c), func() redislock.RetryStrategy {
			return redislock.ExponentialBackoff(time.Millisecond, 64*time.Millisecond)
		}}
	}},
}

var keySeq atomic.Int64

func BenchmarkUncontended(b *testing.B) {
	ctx := context.Background()
	srv := startServer(b)
	all := append([]contender{{"fenced-driver", func(b *testing.B, c *redis.Client) locker {
		d, err := fencedredis.New(c, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { d.Close() })
		return driverLocker{d}
	}}}, contenders[:3]...)
	for _, ct := range all {
		b.Run(ct.name, func(b *testing.B) {
			c, h := newClient(b, srv)
			l := ct.make(b, c)
			key := fmt.Sprintf("bench:unc:%d", keySeq.Add(1))
			// Warm up: connections, script cache.
			for i := 0; i < 10; i++ {
				unlock, err := l.lock(ctx, key)
				if err != nil {
					b.Fatal(err)
				}
				unlock(ctx)
			}
			lat := make([]time.Duration, 0, b.N)
			before := h.trips.Load()
			calls := readServerCalls(b, c)
			busy := scriptMicros(b, c)
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
			// The server's time in scripts per pair (both redislock's
			// calls and fenced's are scripts; redsync's SET is not).
			b.ReportMetric(float64(scriptMicros(b, c)-busy)/float64(b.N), "script-µs/pair")
			served := readServerCalls(b, c).since(calls)
			served.report(b, b.N, "op")
			b.Logf("server, %d pairs: %v", b.N, served)
			reportPercentiles(b, lat, "pair")
		})
	}
}

// BenchmarkHandover measures, for b.N handovers, the time from the holder
// starting its release to the next holder's acquire returning.
func BenchmarkHandover(b *testing.B) {
	srv := startServer(b)
	for _, waiters := range []int{1, 8, 64} {
		for _, ct := range contenders {
			b.Run(fmt.Sprintf("waiters=%d/%s", waiters, ct.name), func(b *testing.B) {
				c, h := newClient(b, srv)
				handover(b, h, ct.make(b, c), waiters)
			})
		}
	}
}

// handover runs waiters+1 goroutines contending for one key through l, for
// b.N handovers, and reports their latency and round trips.
func handover(b *testing.B, h *counter, l locker, waiters int) {
	key := fmt.Sprintf("bench:hand:%d", keySeq.Add(1))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		mu        sync.Mutex
		cond      = sync.NewCond(&mu)
		lat       []time.Duration
		releaseAt time.Time // when the last holder began releasing
		handovers int
		done      = make(chan struct{})
		wg        sync.WaitGroup
	)
	before := h.trips.Load()
	b.ResetTimer()
	for w := 0; w <= waiters; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				unlock, err := l.lock(ctx, key)
				if err != nil {
					return
				}
				got := time.Now()
				mu.Lock()
				if !releaseAt.IsZero() {
					lat = append(lat, got.Sub(releaseAt))
				}
				handovers++
				if handovers == b.N+1 {
					close(done)
				}
				mine := handovers
				cond.Broadcast()
				mu.Unlock()
				time.Sleep(2 * time.Millisecond) // the work: long enough for every waiter to be waiting
				mu.Lock()
				releaseAt = time.Now()
				mu.Unlock()
				unlock(context.Background())
				// Go to the back: wait until another waiter got
				// the lock, so every sample is a real handover
				// and not the releaser barging back in.
				mu.Lock()
				for handovers == mine && ctx.Err() == nil {
					cond.Wait()
				}
				mu.Unlock()
			}
		}()
	}
	select {
	case <-done:
	case <-time.After(5 * time.Minute):
		b.Errorf("only %d of %d handovers in 5 minutes", handovers, b.N)
	}
	b.StopTimer()
	cancel()
	mu.Lock()
	cond.Broadcast()
	mu.Unlock()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	b.ReportMetric(float64(h.trips.Load()-before)/float64(max(len(lat), 1)), "trips/handover")
	reportPercentiles(b, lat, "handover")
}

func reportPercentiles(b *testing.B, lat []time.Duration, what string) {
	if len(lat) == 0 {
		return
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	p := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))].Microseconds()) }
	b.ReportMetric(p(0.50), what+"-p50-µs")
	b.ReportMetric(p(0.99), what+"-p99-µs")
}
