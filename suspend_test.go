package fenced_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/clock"
	"github.com/fenced-dev/fenced/mem"
)

// suspendingClock is a Fake whose readings can jump ahead while its timers
// see nothing: a machine resuming from a suspend, whose boot clock counted
// the time asleep while Go's timers did not.
type suspendingClock struct {
	*clock.Fake
	jump atomic.Int64
}

func (c *suspendingClock) Now() time.Time {
	return c.Fake.Now().Add(time.Duration(c.jump.Load()))
}

// TestValidityAfterSuspend checks that a lease's validity is read from the
// client's clock when asked, not left to the schedule's timer: right after
// a suspend longer than the lease, before any timer fires, Remaining is
// zero, Healthy false, and Err reports the expiry (and ends the lease).
func TestValidityAfterSuspend(t *testing.T) {
	clk := &suspendingClock{Fake: clock.NewFake(time.Now())}
	c := fenced.NewClient(mem.NewStore(clk).Driver(), &fenced.Options{Clock: clk})
	t.Cleanup(func() { c.Close() })
	l, err := c.TryAcquire(context.Background(), "suspend", &fenced.LeaseOptions{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if l.Err() != nil || l.Remaining() <= 0 {
		t.Fatalf("fresh lease: Err %v, Remaining %v", l.Err(), l.Remaining())
	}
	clk.jump.Store(int64(time.Minute))
	if r := l.Remaining(); r != 0 {
		t.Errorf("Remaining %v after a minute's suspend, want 0", r)
	}
	if l.Healthy() {
		t.Error("Healthy after a minute's suspend")
	}
	if err := l.Err(); !errors.Is(err, fenced.ErrExpired) {
		t.Fatalf("Err after a minute's suspend: %v, want ErrExpired", err)
	}
	select {
	case <-l.Context().Done():
	default:
		t.Fatal("Err reported the expiry but the lease's context is not cancelled")
	}
}
