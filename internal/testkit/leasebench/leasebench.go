// Package leasebench holds the benchmarks every backend runs the same way,
// so their figures compare: uncontended acquire+release (time and round
// trips per operation) and handover latency from a release to the next
// waiter's grant, with a given number of waiters on one key.
package leasebench

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
)

// RoundTrips counts request/response round trips on the connections it
// dials: a write that follows a read (or opens the connection) starts a new
// round trip. Pipelined messages sent in one burst count once, as they
// cost one network round trip.
type RoundTrips struct{ n atomic.Int64 }

// Count returns the round trips so far.
func (r *RoundTrips) Count() int64 { return r.n.Load() }

// Dial dials like net.Dialer.DialContext and counts the connection's round
// trips.
func (r *RoundTrips) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, r: r, lastRead: true}, nil
}

type countingConn struct {
	net.Conn
	r        *RoundTrips
	mu       sync.Mutex
	lastRead bool
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	if c.lastRead {
		c.r.n.Add(1)
		c.lastRead = false
	}
	c.mu.Unlock()
	return c.Conn.Write(p)
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.mu.Lock()
		c.lastRead = true
		c.mu.Unlock()
	}
	return n, err
}

// AcquireRelease measures an uncontended TryAcquire plus Release of one key
// through the portable client. It reports round trips per operation when rt
// is not nil (rt must count the client's connections).
func AcquireRelease(b *testing.B, c *fenced.Client, rt *RoundTrips) {
	ctx := context.Background()
	key := fmt.Sprintf("bench:uncontended:%d", time.Now().UnixNano())
	opts := &fenced.LeaseOptions{TTL: time.Minute}
	// Warm up: prepared statements, pooled connections.
	for range 20 {
		l, err := c.TryAcquire(ctx, key, opts)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
	var before int64
	if rt != nil {
		before = rt.Count()
	}
	b.ResetTimer()
	for b.Loop() {
		l, err := c.TryAcquire(ctx, key, opts)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if rt != nil {
		b.ReportMetric(float64(rt.Count()-before)/float64(b.N), "roundtrips/op")
	}
}

// Handover measures the time from a holder's Release call to the moment the
// next holder's Acquire returns. There are the given number of waiters on
// one key besides the holder, each its own client (as another process would
// be). Every participant loops. It acquires, then waits until all the
// others are waiting again, plus 2ms for them to settle. It notes the time
// and releases. It waits until someone else has been granted the key, and
// acquires again. So each measured handover starts with every other
// participant waiting. It reports p50 and p99 in milliseconds over b.N
// handovers.
func Handover(b *testing.B, waiters int, open func(b *testing.B) *fenced.Client) {
	key := fmt.Sprintf("bench:handover:%d:%d", waiters, time.Now().UnixNano())
	clients := make([]*fenced.Client, waiters+1)
	for i := range clients {
		clients[i] = open(b)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var (
		mu        sync.Mutex
		granted   = sync.NewCond(&mu)
		released  time.Time // when the last holder called Release
		samples   []time.Duration
		lastFence uint64
		waiting   atomic.Int64
		done      = make(chan struct{})
		errs      = make(chan error, len(clients))
		doneOnce  sync.Once
		wg        sync.WaitGroup
	)
	stop := func() {
		cancel()
		mu.Lock()
		granted.Broadcast()
		mu.Unlock()
	}
	b.ResetTimer()
	for _, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				waiting.Add(1)
				l, err := c.Acquire(ctx, key, &fenced.LeaseOptions{TTL: 30 * time.Second, MaxWait: fenced.WaitForever})
				now := time.Now()
				waiting.Add(-1)
				if err != nil {
					if ctx.Err() == nil {
						errs <- err
					}
					return
				}
				mu.Lock()
				if l.Fence() <= lastFence {
					mu.Unlock()
					errs <- fmt.Errorf("fence %d granted after %d", l.Fence(), lastFence)
					return
				}
				lastFence = l.Fence()
				if !released.IsZero() {
					samples = append(samples, now.Sub(released))
				}
				if len(samples) >= b.N {
					doneOnce.Do(func() { close(done) })
				}
				granted.Broadcast()
				mu.Unlock()
				for waiting.Load() < int64(waiters) && ctx.Err() == nil {
					time.Sleep(100 * time.Microsecond)
				}
				time.Sleep(2 * time.Millisecond)
				mu.Lock()
				released = time.Now()
				mu.Unlock()
				if err := l.Release(context.Background()); err != nil {
					errs <- err
					return
				}
				mu.Lock()
				for lastFence == l.Fence() && ctx.Err() == nil {
					granted.Wait()
				}
				mu.Unlock()
			}
		}()
	}
	select {
	case <-done:
	case err := <-errs:
		b.Error(err)
	case <-time.After(5 * time.Minute):
		b.Error("handover benchmark timed out")
	}
	b.StopTimer()
	stop()
	wg.Wait()
	for _, c := range clients {
		c.Close()
	}
	mu.Lock()
	defer mu.Unlock()
	if len(samples) == 0 {
		return
	}
	slices.Sort(samples)
	b.ReportMetric(ms(samples[len(samples)/2]), "p50-ms")
	b.ReportMetric(ms(samples[len(samples)*99/100]), "p99-ms")
	b.ReportMetric(0, "ns/op")
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// RenewalRequests holds m leases with ttl through c, renewed automatically
// every ttl/3. It reports how many requests the client sends in one renewal
// period, counted by rt (which must count c's connections). Once every
// lease has been renewed at least once, it counts over one period. A
// backend that renews in batches (driver.BatchRenewer) sends far fewer
// requests than m. One that renews each lease with its own request sends
// about m. It also reports how many leases were lost meanwhile, and fails
// if any was. A backend whose renewals cannot keep up loses some. ttl must
// leave room for m renewals per period on the store under test.
func RenewalRequests(b *testing.B, c *fenced.Client, rt *RoundTrips, m int, ttl time.Duration) {
	ctx := context.Background()
	prefix := fmt.Sprintf("bench:renewals:%d:", time.Now().UnixNano())
	opts := &fenced.LeaseOptions{TTL: ttl}
	leases := make([]*fenced.Lease, m)
	var (
		wg    sync.WaitGroup
		next  atomic.Int64
		first atomic.Value
	)
	began := time.Now()
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1)) - 1; i < m; i = int(next.Add(1)) - 1 {
				l, err := c.TryAcquire(ctx, fmt.Sprintf("%s%06d", prefix, i), opts)
				if err != nil {
					first.CompareAndSwap(nil, err)
					return
				}
				leases[i] = l
			}
		}()
	}
	wg.Wait()
	if err, _ := first.Load().(error); err != nil {
		b.Fatal(err)
	}
	acquired := time.Since(began)
	period := ttl / 3
	// Every lease is due within one period of its grant; after that (plus
	// a margin for the renewals in flight) each one renews once a period.
	b.ResetTimer()
	time.Sleep(period + period/4)
	before := rt.Count()
	time.Sleep(period)
	requests := rt.Count() - before
	b.StopTimer()
	lost := 0
	for _, l := range leases {
		if l.Err() != nil {
			lost++
		}
	}
	for _, l := range leases {
		_ = l.Release(ctx)
	}
	b.ReportMetric(float64(requests), "requests/period")
	b.ReportMetric(float64(requests)/float64(m), "requests/lease/period")
	b.ReportMetric(float64(lost), "lost")
	b.ReportMetric(acquired.Seconds(), "acquire-all-s")
	b.ReportMetric(0, "ns/op")
	if lost > 0 {
		b.Fatalf("%d of %d leases lost: renewals did not keep up with a %v period", lost, m, period)
	}
}
