package fenced_test

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/clock"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/core/rootaccess"
	"github.com/fenced-dev/fenced/mem"
)

// lateAnswers is a mem driver whose first slow answers (TryAcquire, and
// AcquireTimed when the driver queues) come only after clk has moved on
// by delay: a process stopped while its request was in flight.
type lateAnswers struct {
	*mem.Driver
	clk        *clock.Fake
	delay      time.Duration
	grantsOnly bool         // delay only answers that grant
	slow       atomic.Int64 // answers still to delay
	calls      atomic.Int64
}

func (d *lateAnswers) late(err error) {
	d.calls.Add(1)
	if (err == nil || !d.grantsOnly) && d.slow.Add(-1) >= 0 {
		d.clk.Advance(d.delay)
	}
}

func (d *lateAnswers) TryAcquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	f, err := d.Driver.TryAcquire(ctx, key, owner, ttl)
	d.late(err)
	return f, err
}

func (d *lateAnswers) AcquireTimed(ctx context.Context, key, owner string, ttl time.Duration) (uint64, time.Time, error) {
	f, at, err := d.Driver.AcquireTimed(ctx, key, owner, ttl)
	d.late(err)
	return f, at, err
}

// TestGrantPastItsValidityIsAskedAgain: an answer that comes after the
// grant's local validity ran out (TTL 1 s, validity 988 ms, answer after
// 995 ms, while the store still keeps the grant for 5 ms) must not be handed
// out as a lease with an ended context. The client asks again as the same
// owner, which gives the same grant (same fence) a fresh expiry, and
// returns a live lease. TryAcquire, Acquire with a wait, and Acquire
// through the store's queue are each checked. Before, all three returned
// a lease whose context had already ended with ErrExpired.
func TestGrantPastItsValidityIsAskedAgain(t *testing.T) {
	for _, tc := range []struct {
		name  string
		queue bool
		wait  time.Duration
	}{
		{"TryAcquire", false, 0},
		{"Acquire", false, time.Minute},
		{"AcquireQueued", true, time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clock.NewFake(time.Unix(1000, 0))
			d := &lateAnswers{Driver: mem.New(&mem.Options{Clock: clk, Queue: tc.queue}), clk: clk, delay: 995 * time.Millisecond}
			d.slow.Store(1)
			c := fenced.NewClient(d, &fenced.Options{Clock: clk})
			defer c.Close()
			ctx := context.Background()
			l, err := c.Acquire(ctx, "k", &fenced.LeaseOptions{TTL: time.Second, MaxWait: tc.wait})
			if err != nil {
				t.Fatalf("acquire after one late answer: %v", err)
			}
			defer l.Release(ctx)
			if err := l.Err(); err != nil {
				t.Fatalf("the lease was handed out ended: %v (ValidUntil %v ago)", err, clk.Now().Sub(rootaccess.ValidUntil(l)))
			}
			if left := rootaccess.ValidUntil(l).Sub(clk.Now()); left < 900*time.Millisecond {
				t.Errorf("the lease has %v of validity left, want its validity measured from the second request (988ms)", left)
			}
			if n := d.calls.Load(); n != 2 {
				t.Errorf("%d requests, want 2 (the late one, then one asked again)", n)
			}
			// The store keeps the grant for the fence the client returned.
			g := driver.Grant{Key: "k", Owner: l.Owner(), Fence: l.Fence(), TTL: time.Second}
			if err := d.Driver.Renew(ctx, g); err != nil {
				t.Errorf("the store does not hold the returned lease's grant: %v", err)
			}
		})
	}
}

// acquired is the outcome of an Acquire run in the background.
type acquired struct {
	l   *fenced.Lease
	err error
}

// waitBehindHolder has holder take "k" for a TTL of 1s on clk, unrenewed,
// then starts c's Acquire of "k" with maxWait and returns its outcome.
func waitBehindHolder(t *testing.T, clk *clock.Fake, holder, c *fenced.Client, maxWait time.Duration) <-chan acquired {
	t.Helper()
	ctx := context.Background()
	if _, err := holder.TryAcquire(ctx, "k", &fenced.LeaseOptions{TTL: time.Second, ManualRenew: true}); err != nil {
		t.Fatal(err)
	}
	waitTimers(t, clk, 1) // the holder's schedule
	done := make(chan acquired, 1)
	go func() {
		l, err := c.Acquire(ctx, "k", &fenced.LeaseOptions{TTL: time.Second, MaxWait: maxWait})
		done <- acquired{l, err}
	}()
	return done
}

// TestGrantLatePastMaxWaitIsAskedOnceMore: a waiter stopped while its
// granting request was in flight, past both the grant's validity and
// MaxWait, asks once more as the same owner and gets a live lease, as
// its last try after MaxWait would. Before, a polling waiter gave up with
// ErrExpired (CI: a partitions member stopped while joining ended on its
// own); a queued one did when the MaxWait timer won a race.
func TestGrantLatePastMaxWaitIsAskedOnceMore(t *testing.T) {
	for _, queue := range []bool{false, true} {
		clk := clock.NewFake(time.Unix(1000, 0))
		d := &lateAnswers{Driver: mem.New(&mem.Options{Clock: clk, Queue: queue}), clk: clk, delay: 5 * time.Second, grantsOnly: true}
		d.slow.Store(1)
		holder := fenced.NewClient(d.Driver, &fenced.Options{Clock: clk})
		c := fenced.NewClient(d, &fenced.Options{Clock: clk})
		ctx := context.Background()
		done := waitBehindHolder(t, clk, holder, c, 2*time.Second)
		// The holder's schedule, the waiter's MaxWait, and its sleep (or
		// the store's queue timer).
		waitTimers(t, clk, 3)
		// The holder's grant ends; the waiter's grant is answered 5 s late.
		clk.Advance(1100 * time.Millisecond)
		r := <-done
		if r.err != nil {
			t.Fatalf("queue %v: a grant answered past MaxWait was not asked for again: %v", queue, r.err)
		}
		if err := r.l.Err(); err != nil {
			t.Errorf("queue %v: the lease was handed out ended: %v", queue, err)
		}
		if left := rootaccess.ValidUntil(r.l).Sub(clk.Now()); left < 900*time.Millisecond {
			t.Errorf("queue %v: the lease has %v of validity left, want it measured from the last request", queue, left)
		}
		r.l.Release(ctx)
		c.Close()
		holder.Close()
	}
}

// TestGrantAlwaysLateIsNotHandedOut: when the second answer is late too,
// TryAcquire fails with an error matching ErrExpired instead of returning
// a dead lease, and the grant the store made is released (nobody would
// hold it otherwise): a rival gets the key at once, without waiting for the
// TTL.
func TestGrantAlwaysLateIsNotHandedOut(t *testing.T) {
	clk := clock.NewFake(time.Unix(1000, 0))
	d := &lateAnswers{Driver: mem.New(&mem.Options{Clock: clk}), clk: clk, delay: 995 * time.Millisecond}
	d.slow.Store(2)
	c := fenced.NewClient(d, &fenced.Options{Clock: clk})
	defer c.Close()
	ctx := context.Background()
	l, err := c.TryAcquire(ctx, "k", &fenced.LeaseOptions{TTL: time.Second})
	if err == nil {
		t.Fatalf("TryAcquire returned lease %v (err %v) although every answer came past its validity", l, l.Err())
	}
	if !errors.Is(err, fenced.ErrExpired) {
		t.Errorf("error %v, want one matching ErrExpired", err)
	}
	rival := "rival"
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, err := d.Driver.TryAcquire(ctx, "k", rival, time.Second); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the late grant was not released: a rival still gets %v", err)
		}
	}
}

// deafQueue is a queueing mem driver whose queue has not yet heard that
// the key became free when the wait ends (etcd's watch needs a round trip
// to tell).
type deafQueue struct{ *mem.Driver }

func (d deafQueue) AcquireTimed(ctx context.Context, key, owner string, ttl time.Duration) (uint64, time.Time, error) {
	<-ctx.Done()
	return 0, time.Time{}, ctx.Err()
}

// TestMaxWaitOverWithTheKeyFreeTriesOnce: a waiter whose MaxWait runs out
// while the key has become free (this process was stopped past MaxWait,
// and the holder's grant expired meanwhile) makes one last try and gets
// the key, whether it polls or waits in the store's queue. Before, the
// polling waiter gave up when the wait's timer won the race with its
// sleep, and the queued waiter always gave up.
func TestMaxWaitOverWithTheKeyFreeTriesOnce(t *testing.T) {
	// On one P the clock's Advance fires both timers before the waiter
	// runs, as both are over at once when a stopped process resumes.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	for _, queue := range []bool{false, true} {
		for round := 0; round < 20; round++ {
			clk := clock.NewFake(time.Unix(1000, 0))
			d := mem.New(&mem.Options{Clock: clk, Queue: queue})
			holder := fenced.NewClient(d, &fenced.Options{Clock: clk})
			var waiterDriver driver.Driver = d
			if queue {
				waiterDriver = deafQueue{d}
			}
			c := fenced.NewClient(waiterDriver, &fenced.Options{Clock: clk})
			ctx := context.Background()
			done := waitBehindHolder(t, clk, holder, c, 500*time.Millisecond)
			if queue {
				waitTimers(t, clk, 2) // and the waiter's MaxWait
			} else {
				waitTimers(t, clk, 3) // and the waiter's MaxWait and sleep
			}
			clk.Advance(5 * time.Second)
			r := <-done
			if r.err != nil {
				t.Fatalf("queue %v, round %d: the waiter gave up with the key free: %v", queue, round, r.err)
			}
			r.l.Release(ctx)
			c.Close()
			holder.Close()
		}
	}
}

// lostPlace is a queueing mem driver whose first waits end as a wait in
// etcd's or ZooKeeper's queue ends when its session expired while the
// process was stopped: the waiter's entry vanished, ErrUnavailable.
type lostPlace struct {
	*mem.Driver
	lost atomic.Int64 // waits still to lose
}

func (d *lostPlace) AcquireTimed(ctx context.Context, key, owner string, ttl time.Duration) (uint64, time.Time, error) {
	if d.lost.Add(-1) >= 0 {
		return 0, time.Time{}, errors.Join(fenced.ErrUnavailable, errors.New("our waiter key vanished while waiting"))
	}
	return d.Driver.AcquireTimed(ctx, key, owner, ttl)
}

// TestQueuedWaitThatLostItsPlaceQueuesAgain: a wait in the store's queue
// that lost its place (ErrUnavailable: the session carrying it expired)
// queues again while MaxWait lasts, as a polling wait asks again, and
// gets the key; a held key's waiter gives up only when MaxWait ends. Before,
// the first such loss ended Acquire (CI: a partitions member restarted and
// stopped while it waited for its membership on etcd gave up).
func TestQueuedWaitThatLostItsPlaceQueuesAgain(t *testing.T) {
	ctx := context.Background()
	d := &lostPlace{Driver: mem.New(&mem.Options{Queue: true})}
	d.lost.Store(2)
	c := fenced.NewClient(d, &fenced.Options{MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond})
	defer c.Close()
	l, err := c.Acquire(ctx, "k", &fenced.LeaseOptions{TTL: time.Second, MaxWait: 5 * time.Second})
	if err != nil {
		t.Fatalf("acquire after two lost places: %v", err)
	}
	defer l.Release(ctx)
	// The key held, every place lost: the wait goes on for MaxWait, then
	// its last try finds the key held.
	d.lost.Store(1 << 40)
	start := time.Now()
	_, err = c.Acquire(ctx, "k", &fenced.LeaseOptions{TTL: time.Second, MaxWait: 200 * time.Millisecond})
	if !errors.Is(err, fenced.ErrHeld) {
		t.Errorf("acquire of a held key whose waits lose their place: %v, want ErrHeld", err)
	}
	if d := time.Since(start); d < 200*time.Millisecond || d > 5*time.Second {
		t.Errorf("gave up after %v, want after MaxWait (200ms)", d)
	}
}
