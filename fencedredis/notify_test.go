package fencedredis_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
	"github.com/fenced-dev/fenced/internal/testkit/waketest"
)

// TestWakeups checks the fan-out of releases: only waiters of the released
// key are woken (no herd across keys), one waiter per process per release
// in arrival order, and a wake-up a waiter leaves unconsumed passes on.
// Each time, the waiters' process has tried the key after subscribing and
// been refused, as the Client does before it waits: that refusal is what
// makes the release publish (see the acquire script).
func TestWakeups(t *testing.T) {
	ctx := testCtx(t)
	srv := testenv.StartRedis(t, testenv.RedisConfig{})
	holder := newDriver(t, srv, nil)
	waiters := newDriver(t, srv, nil)
	grant := func(key string) driver.Grant {
		o := owner()
		f, err := holder.TryAcquire(ctx, key, o, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return driver.Grant{Key: key, Owner: o, Fence: f}
	}
	ga, gb := grant("a"), grant("b")
	first, err := waiters.Subscribe(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	second, err := waiters.Subscribe(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	onB, err := waiters.Subscribe(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	defer onB.Close()
	refused := func(key string) {
		t.Helper()
		if _, err := waiters.TryAcquire(ctx, key, owner(), time.Minute); !errors.Is(err, fenced.ErrHeld) {
			t.Fatalf("a waiter's try of held %s: %v, want ErrHeld", key, err)
		}
	}
	refused("a")

	if err := holder.Release(ctx, ga); err != nil {
		t.Fatal(err)
	}
	if !waketest.Woken(first, 10*time.Second) {
		t.Fatal("the oldest waiter of a was not woken by the release of a")
	}
	if waketest.Woken(second, 300*time.Millisecond) {
		t.Fatal("one release woke two waiters of the same process")
	}
	if waketest.Woken(onB, 300*time.Millisecond) {
		t.Fatal("the release of a woke a waiter of b")
	}

	// The first waiter is woken again but leaves without looking: its
	// wake-up goes to the second.
	ga = grant("a")
	refused("a")
	if err := holder.Release(ctx, ga); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // let the message arrive
	first.Close()
	if !waketest.Woken(second, 10*time.Second) {
		t.Fatal("the wake-up of a waiter that left was not passed on")
	}
	second.Close()

	// A break wakes waiters too.
	refused("b")
	if _, err := holder.Break(ctx, "b", "test", "test"); err != nil {
		t.Fatal(err)
	}
	if !waketest.Woken(onB, 10*time.Second) {
		t.Fatal("the waiter of b was not woken by a break")
	}
	_ = gb
}

// TestWaiterWakesAtExpiry: a holder that dies without releasing publishes
// nothing, yet a notified waiter (whose fallback poll is a minute) gets the
// key soon after the grant expires, because the refusal carried the
// grant's PTTL.
func TestWaiterWakesAtExpiry(t *testing.T) {
	ctx := testCtx(t)
	srv := testenv.StartRedis(t, testenv.RedisConfig{})
	dead := newDriver(t, srv, nil)
	if _, err := dead.TryAcquire(ctx, "job", owner(), 700*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	c := fenced.NewClient(newDriver(t, srv, nil), &fenced.Options{FallbackPoll: time.Minute, MinBackoff: time.Minute, MaxBackoff: time.Minute})
	defer c.Close()
	start := time.Now()
	l, err := c.Acquire(ctx, "job", &fenced.LeaseOptions{MinFence: fenced.FenceNone, MaxWait: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("waiter took %v to notice a grant that expired after 700ms", took)
	}
}
