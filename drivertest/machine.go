package drivertest

import (
	"context"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
)

// MeasuredShortTTL returns a Harness.ShortTTL for the machine as loaded
// now: floor, or eight times the slowest of a second's grant and release
// round trips through c, if more. It is rounded up to 100 ms. A store
// whose sessions follow the TTL (ZooKeeper) loses them on a busy machine
// when the TTL is a fixed guess.
func MeasuredShortTTL(t *testing.T, c *fenced.Client, floor time.Duration) time.Duration {
	t.Helper()
	ctx := Context(t)
	key := Key("machine-probe")
	var worst time.Duration
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		at := time.Now()
		l, err := c.TryAcquire(ctx, key, &fenced.LeaseOptions{TTL: time.Minute})
		if err == nil {
			err = l.Release(context.WithoutCancel(ctx))
		}
		if err != nil {
			t.Fatalf("probing the store: %v", err)
		}
		worst = max(worst, time.Since(at))
	}
	ttl := (max(floor, 8*worst) + 99*time.Millisecond).Truncate(100 * time.Millisecond)
	t.Logf("ShortTTL %v: the slowest grant and release of a second took %v", ttl, worst.Round(time.Millisecond))
	return ttl
}
