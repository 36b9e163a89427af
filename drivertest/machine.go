package drivertest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
)

// MeasuredTTL returns a TTL for the machine as loaded now: floor, or eight
// times SlowestGrant through cs, if more, rounded up to 100 ms. A store
// whose sessions follow the TTL (ZooKeeper) loses them on a busy machine
// when the TTL is a fixed guess.
func MeasuredTTL(t *testing.T, floor time.Duration, cs ...*fenced.Client) time.Duration {
	t.Helper()
	worst := SlowestGrant(t, cs...)
	ttl := (max(floor, 8*worst) + 99*time.Millisecond).Truncate(100 * time.Millisecond)
	t.Logf("TTL %v: the slowest grant and release of %d clients at once took %v", ttl, len(cs), worst.Round(time.Millisecond))
	return ttl
}

// StoreTTL is MeasuredTTL through n clients of store, opened for it and
// closed before it returns: the TTL for n processes of store on this
// machine as loaded now.
func StoreTTL(t *testing.T, store string, n int, floor time.Duration) time.Duration {
	t.Helper()
	cs := make([]*fenced.Client, n)
	for i := range cs {
		c, err := fenced.Open(Context(t), store, nil)
		if err != nil {
			t.Fatalf("open %s: %v", store, err)
		}
		defer c.Close()
		cs[i] = c
	}
	return MeasuredTTL(t, floor, cs...)
}

// SlowestGrant returns the slowest grant and release of a probe key seen
// while every client of cs probes its store at once for a second, 20 ms
// apart. Several clients at once see the queue a busy store makes of them
// (on SQLite, its write lock), which a lone probe misses.
func SlowestGrant(t *testing.T, cs ...*fenced.Client) time.Duration {
	t.Helper()
	ctx := Context(t)
	prefix := Key("machine-probe")
	var (
		mu    sync.Mutex
		worst time.Duration
		wg    sync.WaitGroup
	)
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("%s-%d", prefix, i)
			for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
				at := time.Now()
				l, err := c.TryAcquire(ctx, key, &fenced.LeaseOptions{TTL: time.Minute, MinFence: fenced.FenceNone})
				if err == nil {
					err = l.Release(context.WithoutCancel(ctx))
				}
				if err != nil {
					t.Errorf("probing the store: %v", err)
					return
				}
				mu.Lock()
				worst = max(worst, time.Since(at))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return worst
}
