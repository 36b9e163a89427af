package fenced_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/mem"
)

// hungAcquire is a mem driver whose TryAcquire never reaches the store: it
// waits for its context to end (an authority that does not answer) and
// records the context's cause.
type hungAcquire struct {
	*mem.Driver
	entered chan struct{}
	mu      sync.Mutex
	causes  []error
}

func (h *hungAcquire) TryAcquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	h.entered <- struct{}{}
	<-ctx.Done()
	h.mu.Lock()
	h.causes = append(h.causes, context.Cause(ctx))
	h.mu.Unlock()
	return 0, fmt.Errorf("%w: %v", fenced.ErrUnavailable, ctx.Err())
}

// TestCloseAbandonsHungAcquisitions checks that Close, once it stops
// waiting for the store, ends the requests of acquisitions still in
// flight with the cause ErrClosed, whether the caller's context can be
// cancelled or not (the client gives the two different contexts).
func TestCloseAbandonsHungAcquisitions(t *testing.T) {
	h := &hungAcquire{Driver: mem.New(nil), entered: make(chan struct{}, 10)}
	c := fenced.NewClient(h, &fenced.Options{CloseTimeout: 100 * time.Millisecond})
	type valueKey struct{}
	timed, cancel := context.WithTimeout(context.WithValue(context.Background(), valueKey{}, "v"), time.Minute)
	defer cancel()
	errs := make(chan error, 2)
	for _, ctx := range []context.Context{context.WithValue(context.Background(), valueKey{}, "v"), timed} {
		go func() {
			_, err := c.TryAcquire(ctx, "hung", nil)
			errs <- err
		}()
	}
	<-h.entered
	<-h.entered
	// The abandoned acquisitions may return before Close looks, so Close
	// may report success.
	if err := c.Close(); err != nil && !errors.Is(err, fenced.ErrUnknownOutcome) {
		t.Errorf("Close with hung acquisitions: %v, want nil or ErrUnknownOutcome", err)
	}
	for range 2 {
		select {
		case err := <-errs:
			if err == nil {
				t.Error("a hung acquisition returned a lease")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("an acquisition is still hung 10s after Close gave up on the store")
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.causes) < 2 { // a TryAcquire tries once more after ErrUnavailable
		t.Fatalf("%d requests ended, want at least 2", len(h.causes))
	}
	for _, cause := range h.causes {
		if !errors.Is(cause, fenced.ErrClosed) {
			t.Errorf("request ended with cause %v, want ErrClosed", cause)
		}
	}
}

// pollOnly is a mem driver seen only through driver.Driver: no
// notifications, so its waiters poll. afterHeld, if set, runs once when a
// TryAcquire finds the key held, before the answer reaches the client.
type pollOnly struct {
	driver.Driver
	mu        sync.Mutex
	afterHeld func()
}

func (p *pollOnly) TryAcquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	fence, err := p.Driver.TryAcquire(ctx, key, owner, ttl)
	p.mu.Lock()
	after := p.afterHeld
	if errors.Is(err, fenced.ErrHeld) {
		p.afterHeld = nil
	} else {
		after = nil
	}
	p.mu.Unlock()
	if after != nil {
		after()
	}
	return fence, err
}

// TestLocalReleaseWakesWaiter checks that a waiter on a backend that
// cannot notify is woken by a release through its own client at once,
// not at its next poll: when it is already waiting, and when the release
// comes between the store finding the key held and the waiter registering
// for the wake-up (which it does only once it has found the key held).
func TestLocalReleaseWakesWaiter(t *testing.T) {
	ctx := context.Background()
	p := &pollOnly{Driver: mem.New(nil)}
	// Polls far apart: a waiter that got its key within a second was woken.
	c := fenced.NewClient(p, &fenced.Options{MinBackoff: 20 * time.Second, MaxBackoff: 20 * time.Second})
	defer c.Close()
	for _, racing := range []bool{false, true} {
		key := fmt.Sprintf("wake:%v", racing)
		holder, err := c.TryAcquire(ctx, key, &fenced.LeaseOptions{TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		released := make(chan struct{})
		release := func() {
			if err := holder.Release(ctx); err != nil {
				t.Error(err)
			}
			close(released)
		}
		if racing {
			p.mu.Lock()
			p.afterHeld = release
			p.mu.Unlock()
		}
		got := make(chan error, 1)
		go func() {
			l, err := c.Acquire(ctx, key, &fenced.LeaseOptions{TTL: time.Minute, MaxWait: 10 * time.Second})
			if err == nil {
				err = l.Release(ctx)
			}
			got <- err
		}()
		if !racing {
			time.Sleep(20 * time.Millisecond) // the waiter is waiting
			release()
		}
		<-released
		select {
		case err := <-got:
			if err != nil {
				t.Fatalf("racing %v: waiter: %v", racing, err)
			}
		case <-time.After(2 * time.Second):
			t.Fatalf("racing %v: the waiter was not woken by the release", racing)
		}
	}
}
