package fenced_test

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/clock"
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

// lingerClient returns a client on a fake clock whose schedule has just
// emptied and lingers: its loop sleeps on the idle linger's timer, due a
// second after clk's reading when it returns. renewals counts the
// client's confirmed renewals.
func lingerClient(t *testing.T) (c *fenced.Client, clk *clock.Fake, renewals *atomic.Int64) {
	t.Helper()
	clk = clock.NewFake(time.Unix(1000, 0))
	renewals = new(atomic.Int64)
	c = fenced.NewClient(mem.New(&mem.Options{Clock: clk}), &fenced.Options{Clock: clk, Hooks: fenced.Hooks{
		Renewed: func(e fenced.RenewEvent) {
			if e.Err == nil {
				renewals.Add(1)
			}
		},
	}})
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	l, err := c.TryAcquire(ctx, "first", &fenced.LeaseOptions{TTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// The loop sleeps until the lease's first renewal, released before it:
	// it then finds the schedule empty, and lingers.
	waitTimers(t, clk, 1)
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	waitTimers(t, clk, 1)
	return c, clk, renewals
}

// waitTimers waits until n timers wait on clk: the schedule's loop has
// gone back to sleep.
func waitTimers(t *testing.T, clk *clock.Fake, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); clk.Timers() != n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d timers wait on the fake clock, want %d (the schedule's loop asleep)", clk.Timers(), n)
		}
	}
}

// waitRenewed waits until renewals reaches n, without moving the fake
// clock: the schedule must already have a timer (or a wake-up) for it.
func waitRenewed(t *testing.T, renewals *atomic.Int64, n int64, l *fenced.Lease) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); renewals.Load() < n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d renewals confirmed, want %d: the schedule missed a renewal that fell due (lease: %v)", renewals.Load(), n, l.Err())
		}
	}
}

// TestLeaseAddedWhileTheScheduleLingersRenewsOnTime acquires a lease while
// the schedule's loop lingers on its idle timer, with a first renewal due
// before that timer: the loop must be woken for it. On a schedule that
// lets a lingering loop sleep on (taking the linger's timer for one set
// for the new lease), the renewal is missed and the lease expires
// locally while it could have been renewed: the holder loses its lease
// for nothing, and a waiter takes over.
func TestLeaseAddedWhileTheScheduleLingersRenewsOnTime(t *testing.T) {
	c, clk, renewals := lingerClient(t)
	ctx := context.Background()
	// First renewal due 200 ms from now, 800 ms before the linger's timer;
	// validity ends 500 ms from now.
	l, err := c.TryAcquire(ctx, "short", &fenced.LeaseOptions{TTL: 600 * time.Millisecond, SafetyMargin: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(250 * time.Millisecond)
	waitRenewed(t, renewals, 1, l)
	// And it goes on renewing: a period at a time, well within validity.
	for i := range 5 {
		waitTimers(t, clk, 1)
		clk.Advance(200 * time.Millisecond)
		waitRenewed(t, renewals, int64(i+2), l)
	}
	if err := l.Err(); err != nil {
		t.Fatalf("the lease ended: %v", err)
	}
}

// TestLeaseAddedAfterTheLingerRenewsOnTime acquires a lease while the
// schedule's loop lingers, with a first renewal due after the linger's
// timer: nothing wakes the loop, which must find the lease when that
// timer fires and keep a timer for its renewal then (rather than, finding
// the linger over, sleep without one).
func TestLeaseAddedAfterTheLingerRenewsOnTime(t *testing.T) {
	c, clk, renewals := lingerClient(t)
	ctx := context.Background()
	clk.Advance(900 * time.Millisecond) // 100 ms of linger left
	l, err := c.TryAcquire(ctx, "long", &fenced.LeaseOptions{TTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(200 * time.Millisecond) // the linger's timer fires
	waitTimers(t, clk, 1)               // the loop sleeps on one for the lease
	clk.Advance(900 * time.Millisecond) // first renewal due (1 s after acquiring)
	waitRenewed(t, renewals, 1, l)
	if err := l.Err(); err != nil {
		t.Fatalf("the lease ended: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Emptied again, the schedule lingers a second, then sleeps with no
	// timer at all: an idle client keeps none.
	clk.Advance(time.Second) // the lease's old renewal moment: empty, linger
	waitTimers(t, clk, 1)
	clk.Advance(time.Second)
	waitTimers(t, clk, 0)
}
