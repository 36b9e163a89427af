package fenced_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/mem"
)

// TestShortLeasesDoNotWakeTheSchedule takes and releases renewing leases
// one after the other, giving the schedule's loop time to run between
// them, as a lock around short work does. Each lease empties the schedule
// when it ends; the loop must keep its timer then (idleLinger) rather
// than need a goroutine wake-up for every lease, which was the cost that
// kept the Client's uncontended acquire+release behind its driver's.
func TestShortLeasesDoNotWakeTheSchedule(t *testing.T) {
	// On one P the loop, once woken, runs only when this goroutine sleeps:
	// after the release, when the schedule is empty again (as it does on a
	// busy machine while a lease's requests are in flight).
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	c := fenced.NewClient(mem.New(nil), nil)
	defer c.Close()
	ctx := context.Background()
	const n = 50
	var first int64
	for i := range n {
		l, err := c.Acquire(ctx, "k", &fenced.LeaseOptions{TTL: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			// The first lease starts the loop and wakes it.
			time.Sleep(5 * time.Millisecond)
			first = fenced.RenewerLoops(c)
			continue
		}
		time.Sleep(time.Millisecond) // time for the loop to run
	}
	// The test takes well under idleLinger (1 s) after the first lease;
	// allow a few passes for a slow machine.
	if got := fenced.RenewerLoops(c) - first; got > 5 {
		t.Errorf("the schedule loop ran %d times for %d leases after the first, each released before the next: want it kept armed, not woken per lease", got, n-1)
	}
}
