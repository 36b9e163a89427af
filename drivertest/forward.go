package drivertest

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/core/capability"
)

// stalling passes a notifying driver through, except that while stall is
// set its TryAcquire hangs until its context ends, as over a cut network:
// a waiter that took a wake-up and gives up in the middle of its look.
type stalling struct {
	driver.Driver
	n       driver.Notifier
	stall   atomic.Bool
	stalled chan struct{}
}

func (s *stalling) TryAcquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	if s.stall.Load() {
		select {
		case s.stalled <- struct{}{}:
		default:
		}
		<-ctx.Done()
		return 0, ctx.Err()
	}
	return s.Driver.TryAcquire(ctx, key, owner, ttl)
}

func (s *stalling) Subscribe(ctx context.Context, key string) (driver.Subscription, error) {
	return s.n.Subscribe(ctx, key)
}

// testGiveUpMidLook runs on a backend that wakes waiters by notification. A
// waiter gives up after it took the wake-up of a release, with its look at
// the store still in flight. The test checks that this strands nobody: the
// next waiter in the same process is granted the key long before its
// fallback timer (a minute, as long as the grant's TTL). A backend that
// wakes one waiter per release must hand such a wake-up on
// (driver.WakeForwarder).
func (s *suite) testGiveUpMidLook(t *testing.T) {
	d := s.drv(t)
	ops := capability.Of(d)
	n := ops.Notifier
	if n == nil || ops.Queuer != nil {
		skipUndeclared(t, "Subscribe (driver.Notifier) without a Queue", "waiters poll, or wait in the authority's own queue")
	}
	ctx := Context(t)
	key := Key("giveup")
	holder, err := s.h.Client(t, nil).TryAcquire(ctx, key, &fenced.LeaseOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	opts := func(attempts *atomic.Int64) *fenced.Options {
		return &fenced.Options{MinBackoff: time.Minute, MaxBackoff: time.Minute, FallbackPoll: time.Minute,
			MinFence: s.h.MinFence,
			Hook: func(e fenced.Event) {
				if e.Kind == fenced.EventAttempt {
					attempts.Add(1)
				}
			}}
	}
	var n1, n2 atomic.Int64
	first := &stalling{Driver: d, n: n, stalled: make(chan struct{}, 1)}
	c1, c2 := fenced.NewClient(first, opts(&n1)), fenced.NewClient(d, opts(&n2))
	t.Cleanup(func() { c1.Close(); c2.Close() })
	wait := &fenced.LeaseOptions{TTL: time.Minute, MaxWait: 45 * time.Second}
	ctx1, cancel1 := context.WithCancel(ctx)
	defer cancel1()
	err1 := make(chan error, 1)
	go func() {
		_, err := c1.Acquire(ctx1, key, wait)
		err1 <- err
	}()
	// The first waiter subscribed (its second look); give a backend that
	// lets a new waiter look once more time to do so.
	waitAttempts(t, &n1, err1)
	time.Sleep(300 * time.Millisecond)
	got2 := make(chan error, 1)
	go func() {
		l2, err := c2.Acquire(ctx, key, wait)
		if err == nil {
			l2.Release(ctx)
		}
		got2 <- err
	}()
	waitAttempts(t, &n2, got2)
	time.Sleep(300 * time.Millisecond)
	first.stall.Store(true)
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-first.stalled:
	case err := <-got2:
		// The backend woke the second waiter (too, or first): nothing
		// was stranded.
		if err != nil {
			t.Fatal(err)
		}
		return
	case <-time.After(20 * time.Second):
		t.Fatal("the release woke neither waiter within 20s although polling was set to once a minute")
	}
	cancel1()
	if err := <-err1; err == nil {
		t.Fatal("a waiter whose look never reached the store was granted the key")
	}
	select {
	case err := <-got2:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the wake-up taken by a waiter that gave up was not handed on: " +
			"the next waiter still sleeps on its one-minute fallback timer")
	}
}

// waitAttempts waits until a waiter has made its second attempt (it has
// subscribed), failing if its Acquire returns first.
func waitAttempts(t *testing.T, attempts *atomic.Int64, done <-chan error) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for attempts.Load() < 2 {
		select {
		case err := <-done:
			t.Fatalf("waiter returned before it waited: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("waiter did not subscribe within 20s")
		}
		time.Sleep(time.Millisecond)
	}
}
