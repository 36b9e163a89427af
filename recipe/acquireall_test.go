package recipe_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/clock"
	"github.com/fenced-dev/fenced/recipe"
)

// TestAcquireAllFailsWhenAnEarlierLeaseWasBroken breaks k1 on SQLite
// while AcquireAll, holding k1, waits for k2 (held by another client),
// then lets k2 go: AcquireAll must not hand out a set with k1 lost, which
// k1's lease would learn of only at its renewal a third of its TTL
// later. It must fail naming k1, and leave k2 free.
func TestAcquireAllFailsWhenAnEarlierLeaseWasBroken(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs := openN(t, sqliteURL(t), 2)
	c, operator := cs[0], cs[1]
	opts := &fenced.LeaseOptions{TTL: 30 * time.Second, MaxWait: 20 * time.Second}
	k2, err := operator.TryAcquire(ctx, "k2", opts)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		set *recipe.LeaseSet
		err error
	}
	done := make(chan result, 1)
	go func() {
		set, err := recipe.AcquireAll(ctx, c, []string{"k2", "k1"}, opts)
		done <- result{set, err}
	}()
	// AcquireAll holds k1 and waits for k2.
	for {
		info, err := operator.Inspect(ctx, "k1")
		if err == nil && info.Held {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("AcquireAll never took k1")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := operator.Break(ctx, "k1", "test", "test"); err != nil {
		t.Fatal(err)
	}
	if err := k2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err == nil {
		err := r.set.Err()
		r.set.Release(ctx)
		t.Fatalf("AcquireAll returned a set although k1 was broken while it waited for k2 (set.Err() = %v)", err)
	}
	if !errors.Is(r.err, fenced.ErrNotHeld) && !fenced.IsLost(r.err) {
		t.Fatalf("AcquireAll = %v; want the loss of k1", r.err)
	}
	if l, err := operator.TryAcquire(ctx, "k2", opts); err != nil {
		t.Fatalf("k2 after the failed AcquireAll: %v; want free", err)
	} else {
		l.Release(ctx)
	}
}

// TestLeaseSetReflectsALossAtOnce checks that a set is unhealthy as soon
// as one of its leases is: once a member's Renew has reported the loss,
// the set's Err, Done and Context already say so.
func TestLeaseSetReflectsALossAtOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs := openN(t, sqliteURL(t), 2)
	c, operator := cs[0], cs[1]
	for range 20 {
		set, err := recipe.AcquireAll(ctx, c, []string{"a", "b"}, &fenced.LeaseOptions{TTL: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := operator.Break(ctx, "a", "test", "test"); err != nil {
			t.Fatal(err)
		}
		lease := set.Leases()[0]
		if err := lease.Renew(ctx); !errors.Is(err, fenced.ErrNotHeld) {
			t.Fatalf("renewal of the broken lease: %v", err)
		}
		if err := set.Err(); !fenced.IsLost(err) {
			t.Fatalf("set.Err() right after its lease on a was lost = %v; want the loss", err)
		}
		select {
		case <-set.Context().Done():
		default:
			t.Fatal("set.Context().Done() not closed right after its lease on a was lost")
		}
		if set.Context().Err() == nil {
			t.Fatal("set.Context().Err() = nil right after its lease on a was lost")
		}
		set.Release(ctx)
	}
}

// stalledClock is a client clock whose timers never fire while its time
// moves on (Jump): the client's schedule, which cancels a lease's context
// when its validity runs out, is as late as a starved process's. Each
// lease's Err reads the clock itself and says the lease is over; the
// set's must too.
type stalledClock struct {
	fake *clock.Fake
	mu   sync.Mutex
	skew time.Duration
}

func (c *stalledClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.fake.Now().Add(c.skew)
}

// NewTimer returns a timer of the underlying fake clock, which is never
// advanced: it never fires.
func (c *stalledClock) NewTimer(d time.Duration) clock.Timer {
	return c.fake.NewTimer(max(d, time.Hour))
}

// Jump moves Now on by d without firing a timer.
func (c *stalledClock) Jump(d time.Duration) {
	c.mu.Lock()
	c.skew += d
	c.mu.Unlock()
}

// TestLeaseSetEndsWithAMemberValidityWhenTheScheduleIsLate holds a set on
// SQLite from a client whose schedule never runs (its timers never fire,
// as in a process starved of CPU), then moves the client's clock past the
// leases' validity. Each lease's Err says it expired; the set's Err,
// Context().Err and Done must say so as well, at once: the store may
// already have granted the keys to someone else. A set that reads only
// its leases' contexts (which the late schedule has not cancelled yet)
// would still report itself healthy.
func TestLeaseSetEndsWithAMemberValidityWhenTheScheduleIsLate(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	clk := &stalledClock{fake: clock.NewFake(time.Now())}
	c, err := fenced.Open(ctx, sqliteURL(t), &fenced.Options{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	opts := &fenced.LeaseOptions{TTL: 10 * time.Second, ManualRenew: true}
	set, err := recipe.AcquireAll(ctx, c, []string{"a", "b"}, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer set.Release(ctx)
	if err := set.Err(); err != nil {
		t.Fatalf("set.Err() right after AcquireAll = %v", err)
	}
	clk.Jump(opts.TTL + time.Second)
	if err := set.Err(); !errors.Is(err, fenced.ErrExpired) {
		t.Fatalf("set.Err() once the client's clock is past the leases' validity (their schedule late) = %v; want ErrExpired "+
			"(the lease on %q says %v)", err, set.Leases()[0].Key(), set.Leases()[0].Err())
	}
	if set.Context().Err() == nil {
		t.Fatal("set.Context().Err() = nil past the leases' validity")
	}
	select {
	case <-set.Context().Done():
	default:
		t.Fatal("set.Context().Done() not closed past the leases' validity")
	}
}
