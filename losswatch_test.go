package fenced_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/clock"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/mem"
)

// lossWatching is a mem driver that implements driver.LossWatcher: each
// watch it is asked for records its grant and waits for a loss that the
// test reports with lose.
type lossWatching struct {
	*mem.Driver
	mu      sync.Mutex
	watched []driver.Grant
	losses  map[string]func(error) // by owner, while watched
	stopped int
}

func (w *lossWatching) WatchLoss(g driver.Grant, lost func(error)) (func(), error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.watched = append(w.watched, g)
	w.losses[g.Owner] = lost
	return func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		delete(w.losses, g.Owner)
		w.stopped++
	}, nil
}

func (w *lossWatching) watches() []driver.Grant {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]driver.Grant(nil), w.watched...)
}

// lose reports owner's grant lost through its watch.
func (w *lossWatching) lose(owner string) bool {
	w.mu.Lock()
	lost, ok := w.losses[owner]
	w.mu.Unlock()
	if ok {
		lost(fenced.ErrLost)
	}
	return ok
}

func (w *lossWatching) stops() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stopped
}

// TestLossWatchStartsOnlyForLeasesHeldAWhile checks that a lease released
// soon after its grant never starts its driver's loss watch (a short hold
// costs the authority no watch and the client no goroutine), and that a
// lease held longer does, ends when the watch reports the loss, and then
// stops its watch.
func TestLossWatchStartsOnlyForLeasesHeldAWhile(t *testing.T) {
	w := &lossWatching{Driver: mem.New(nil), losses: map[string]func(error){}}
	c := fenced.NewClient(w, nil)
	defer c.Close()
	ctx := context.Background()
	opts := &fenced.LeaseOptions{TTL: 10 * time.Second}

	for range 20 {
		l, err := c.Acquire(ctx, "short", opts)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	long, err := c.Acquire(ctx, "long", opts)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(w.watches()) == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	got := w.watches()
	if len(got) != 1 || got[0].Key != "long" || got[0].Fence != long.Fence() || got[0].Owner != long.Owner() {
		t.Fatalf("watches started: %+v; want exactly one, of the lease held past the delay (fence %d)", got, long.Fence())
	}
	if long.Err() != nil {
		t.Fatalf("lease ended before any loss: %v", long.Err())
	}
	if !w.lose(long.Owner()) {
		t.Fatal("no watch for the held lease's owner")
	}
	select {
	case <-long.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the lease did not end within 5s of its watch reporting the loss")
	}
	if err := long.Err(); !errors.Is(err, fenced.ErrLost) {
		t.Fatalf("lease ended with %v, want ErrLost", err)
	}
	for w.stops() != 1 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := w.stops(); n != 1 {
		t.Fatalf("the ended lease's watch was stopped %d times, want once", n)
	}
}

// TestWatchedLossPastValidityIsAnExpiry checks that a loss the driver's
// watch reports once the lease's local validity has run out ends the
// lease as an expiry (ErrExpired), as the schedule would have: on a busy
// machine the store's deletion of a given-up grant can be reported before
// the late schedule ends the lease (fencedetcd's conformance run, hog a3).
func TestWatchedLossPastValidityIsAnExpiry(t *testing.T) {
	fake := clock.NewFake(time.Unix(1_000_000, 0))
	c := fenced.NewClient(mem.New(nil), &fenced.Options{Clock: fake})
	defer c.Close()
	l, err := c.TryAcquire(context.Background(), "k", &fenced.LeaseOptions{TTL: 10 * time.Second, ManualRenew: true})
	if err != nil {
		t.Fatal(err)
	}
	fake.Advance(11 * time.Second)
	fenced.LoseWatched(l, fenced.ErrLost)
	<-l.Context().Done()
	if err := l.Err(); !errors.Is(err, fenced.ErrExpired) {
		t.Fatalf("a loss watched past the validity ended the lease with %v, want ErrExpired", err)
	}
}
