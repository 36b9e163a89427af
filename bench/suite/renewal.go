package main

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/testkit/leasebench"
)

// holder is one implementation holding many leases from one process and
// keeping them alive.
type holder interface {
	// acquire takes key (free) with ttl and keeps it renewed until
	// releaseAll. It is called from many goroutines at once.
	acquire(ctx context.Context, key string, ttl time.Duration) error
	// lost counts the leases that are no longer held (failed renewals,
	// lost sessions), with the cause of one of them.
	lost() (int, error)
	releaseAll(ctx context.Context)
	close()
}

// holderImpl is an implementation of the renewal workload.
type holderImpl struct {
	name string
	// how renewal works, for the report ("batched script", "one Extend per lock", "session keep-alive").
	how  string
	open func(ctx context.Context, ttl time.Duration) (holder, error)
}

// acquireParallel is how many acquisitions are in flight while the
// renewal workload takes its leases.
const acquireParallel = 64

// acquireLimit bounds how long the renewal workload takes its leases.
const acquireLimit = 5 * time.Minute

// renewal runs W4: one process holds m leases for several renewal
// periods; the backend's server counts the requests it gets per period.
func (s *suite) renewal(ctx context.Context, b *backend) {
	for _, m := range s.cfg.renewalM {
		ttl := b.renewalTTL(m)
		for _, hi := range b.holders {
			r := Row{Workload: "renewal", Backend: b.name, Implementation: hi.name, Params: map[string]any{
				"leases": m, "ttl_ms": ttl.Milliseconds(), "period_ms": (ttl / 3).Milliseconds(), "periods": s.cfg.periods,
				"renewal": hi.how,
			}}
			if err := s.renewOnce(ctx, b, hi, m, ttl, &r); err != nil {
				r.Error = err.Error()
			}
			s.add(r)
		}
	}
}

func (s *suite) renewOnce(ctx context.Context, b *backend, hi holderImpl, m int, ttl time.Duration, r *Row) error {
	keys := make([]string, m)
	prefix := uniqueKey("w4-", hi.name)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s/%06d", prefix, i)
	}
	heap0, gor0 := heapAndGoroutines()
	h, err := hi.open(ctx, ttl)
	if err != nil {
		return err
	}
	defer h.close()
	began := time.Now()
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	// The leases' context must outlive the acquisition, so the time limit
	// stops taking new keys rather than cancelling the calls.
	deadline := began.Add(acquireLimit)
	for range acquireParallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1)) - 1; i < m; i = int(next.Add(1)) - 1 {
				if time.Now().After(deadline) {
					errOnce.Do(func() { firstErr = fmt.Errorf("%w: took only %d of %d leases in %v", errTimeout, i, m, acquireLimit) })
					return
				}
				if err := h.acquire(ctx, keys[i], ttl); err != nil {
					errOnce.Do(func() { firstErr = fmt.Errorf("acquire %d of %d: %w", i, m, err) })
					return
				}
			}
		}()
	}
	wg.Wait()
	defer h.releaseAll(context.Background())
	if firstErr != nil {
		return firstErr
	}
	r.AcquireAllSeconds = time.Since(began).Seconds()
	period := ttl / 3
	// Every lease is due within a period of its grant; after that (and a
	// margin for renewals in flight) each renews once a period.
	time.Sleep(period + period/4)
	cpu0, t0 := leasebench.CPUTime().Seconds(), time.Now()
	calls := delta(b.renewalCount, func() { time.Sleep(time.Duration(s.cfg.periods) * period) })
	cpu := leasebench.CPUTime().Seconds() - cpu0
	wall := time.Since(t0).Seconds()
	heap1, gor1 := heapAndGoroutines()
	lost, cause := h.lost()
	r.LeasesLost = &lost
	if cause != nil {
		r.LossCause = cause.Error()
	}
	if b.renewalCount != nil {
		r.ServerCallsPerPeriod = float64(calls) / float64(s.cfg.periods)
		r.RequestsPerOp = r.ServerCallsPerPeriod / float64(m)
	}
	r.CPUSecondsPerSecond = cpu / wall
	r.HeapBytesPerLease = float64(int64(heap1)-int64(heap0)) / float64(m)
	r.Goroutines = gor1 - gor0
	return nil
}

func heapAndGoroutines() (uint64, int) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc, runtime.NumGoroutine()
}

// fencedHolder holds leases through one fenced.Client, renewed by the
// Client itself.
type fencedHolder struct {
	c         *fenced.Client
	closeAlso func() error // the client library under the driver, if any
	mu        sync.Mutex
	leases    []*fenced.Lease
}

func openFencedHolder(url string) func(ctx context.Context, ttl time.Duration) (holder, error) {
	return func(ctx context.Context, ttl time.Duration) (holder, error) {
		c, err := fenced.Open(ctx, url, nil)
		if err != nil {
			return nil, err
		}
		return &fencedHolder{c: c}, nil
	}
}

func (h *fencedHolder) acquire(ctx context.Context, key string, ttl time.Duration) error {
	l, err := h.c.TryAcquire(ctx, key, &fenced.LeaseOptions{TTL: ttl, MinFence: minFence(h.c)})
	if err != nil {
		return err
	}
	h.mu.Lock()
	h.leases = append(h.leases, l)
	h.mu.Unlock()
	return nil
}

func (h *fencedHolder) lost() (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	var cause error
	for _, l := range h.leases {
		if err := l.Err(); err != nil {
			n++
			cause = err
		}
	}
	return n, cause
}

func (h *fencedHolder) releaseAll(ctx context.Context) {
	h.mu.Lock()
	ls := h.leases
	h.leases = nil
	h.mu.Unlock()
	parallel(len(ls), func(i int) { ls[i].Release(ctx) })
}

func (h *fencedHolder) close() {
	h.c.Close()
	if h.closeAlso != nil {
		h.closeAlso()
	}
}

// parallel runs f(0..n-1) on acquireParallel goroutines.
func parallel(n int, f func(i int)) {
	var (
		next atomic.Int64
		wg   sync.WaitGroup
	)
	for range acquireParallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				f(i)
			}
		}()
	}
	wg.Wait()
}

// refresher renews, every period, each lock an incumbent holds with its
// own call (redsync's Extend, redislock's Refresh): what a user of those
// libraries has to write, since they do not renew by themselves. A lock
// whose renewal fails is lost and no longer renewed.
type refresher struct {
	mu    sync.Mutex
	held  []*refreshed
	nLost atomic.Int64
	cause atomic.Value // an error
	stop  chan struct{}
	done  chan struct{}
}

type refreshed struct {
	renew, release func(context.Context) error
	dead           bool // written by the refresher's loop only
}

func newRefresher(period time.Duration) *refresher {
	r := &refresher{stop: make(chan struct{}), done: make(chan struct{})}
	go r.loop(period)
	return r
}

func (r *refresher) add(renew, release func(context.Context) error) {
	r.mu.Lock()
	r.held = append(r.held, &refreshed{renew: renew, release: release})
	r.mu.Unlock()
}

func (r *refresher) snapshot() []*refreshed {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.held
}

func (r *refresher) loop(period time.Duration) {
	defer close(r.done)
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
		held := r.snapshot()
		parallel(len(held), func(i int) {
			if held[i].dead {
				return
			}
			if err := held[i].renew(context.Background()); err != nil {
				held[i].dead = true
				r.nLost.Add(1)
				r.cause.Store(err)
			}
		})
	}
}

func (r *refresher) lost() (int, error) {
	err, _ := r.cause.Load().(error)
	return int(r.nLost.Load()), err
}

func (r *refresher) releaseAll(ctx context.Context) {
	close(r.stop)
	<-r.done
	held := r.snapshot()
	parallel(len(held), func(i int) { held[i].release(ctx) })
}
