package drivertest

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/core/capability"
)

// stalling passes a notifying driver through, except that while stall is
// set its TryAcquire hangs until its context ends, as over a cut network:
// a waiter that took a wake-up and gives up in the middle of its look. It
// counts the tries the store refused.
type stalling struct {
	driver.Driver
	n       driver.Notifier
	stall   atomic.Bool
	stalled chan struct{}
	refused atomic.Int64
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
	f, err := s.Driver.TryAcquire(ctx, key, owner, ttl)
	if errors.Is(err, fenced.ErrHeld) {
		s.refused.Add(1)
	}
	return f, err
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
	opts := &fenced.Options{MinBackoff: time.Minute, MaxBackoff: time.Minute, FallbackPoll: time.Minute,
		MinFence: s.h.MinFence}
	first := &stalling{Driver: d, n: n, stalled: make(chan struct{}, 1)}
	second := &stalling{Driver: d, n: n, stalled: make(chan struct{}, 1)} // never stalled
	c1, c2 := fenced.NewClient(first, opts), fenced.NewClient(second, opts)
	t.Cleanup(func() { c1.Close(); c2.Close() })
	wait := &fenced.LeaseOptions{TTL: time.Minute, MaxWait: 45 * time.Second}
	ctx1, cancel1 := context.WithCancel(ctx)
	defer cancel1()
	err1 := make(chan error, 1)
	go func() {
		_, err := c1.Acquire(ctx1, key, wait)
		err1 <- err
	}()
	// The first waiter subscribed, and the store refused its look after
	// that; give a backend that lets a new waiter look once more time to
	// do so.
	waitRefused(t, first, err1)
	time.Sleep(300 * time.Millisecond)
	got2 := make(chan error, 1)
	go func() {
		l2, err := c2.Acquire(ctx, key, wait)
		if err == nil {
			l2.Release(ctx)
		}
		got2 <- err
	}()
	waitRefused(t, second, got2)
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

// waitRefused waits until the store has refused a waiter's second try,
// the one after it subscribed (under load that answer came well after
// the try began: a release before it granted the key to the waiter
// instead). It fails if the waiter's Acquire returns first.
func waitRefused(t *testing.T, s *stalling, done <-chan error) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for s.refused.Load() < 2 {
		select {
		case err := <-done:
			t.Fatalf("waiter returned before it waited: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the store did not refuse the waiter's second try within a minute")
		}
		time.Sleep(time.Millisecond)
	}
}
