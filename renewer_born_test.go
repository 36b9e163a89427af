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
	"github.com/fenced-dev/fenced/internal/core/rootaccess"
	"github.com/fenced-dev/fenced/mem"
)

// TestLeaseGrantedPastItsValidity hands out a lease whose grant came after
// its local validity ran out (the request was sent 2 s before, with a 1 s
// TTL), as when the process stops between Acquire's check of the answer
// (TestGrantAlwaysLateIsNotHandedOut) and the hand-out. Its context must
// already be ended, with ErrExpired, when it is handed out: before, the
// lease joined the schedule and the loop, woken for it, ended it only when
// it next ran (seconds late on a loaded machine, which the long generative
// proof saw as leases live past their validity by up to 3.4 s).
func TestLeaseGrantedPastItsValidity(t *testing.T) {
	// On one P the woken loop cannot run before this goroutine blocks.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	clk := clock.NewFake(time.Unix(1000, 0))
	var lost atomic.Int64
	d := mem.New(&mem.Options{Clock: clk})
	c := fenced.NewClient(d, &fenced.Options{Clock: clk, Hook: func(e fenced.Event) {
		if e.Kind == fenced.EventLost {
			lost.Add(1)
		}
	}})
	defer c.Close()
	ctx := context.Background()
	sent := clk.Now()
	fence, err := d.TryAcquire(ctx, "k", "holder", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Second)
	l, err := fenced.HandOutLease(c, "k", "holder", fence, sent, &fenced.LeaseOptions{TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Context().Err(); err == nil {
		t.Fatalf("a lease %v was handed out past its ValidUntil (%v ago) with a live context", l, clk.Now().Sub(rootaccess.ValidUntil(l)))
	}
	if cause := context.Cause(l.Context()); !errors.Is(cause, fenced.ErrExpired) {
		t.Errorf("the lease's cause is %v, want ErrExpired", cause)
	}
	for deadline := time.Now().Add(5 * time.Second); lost.Load() != 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the Lost hook ran %d times, want once", lost.Load())
		}
	}
	if err := l.Release(ctx); err != nil && !errors.Is(err, fenced.ErrNotHeld) {
		t.Errorf("Release of the expired lease: %v", err)
	}
}

// TestSlowLostHookDelaysNoOtherLease ends a lease whose Lost hook is slow
// (here it blocks until the test lets it go), then lets a second lease's
// validity run out: the second lease's context must end at its validity,
// not after the first one's hook. Before, the schedule's loop ran the Lost
// hooks of the leases it had ended before it looked at the schedule
// again: in the long generative proof the hooks of a batch of 4 000
// expired leases (a history record each) took 340 ms, and leases due
// meanwhile outlived their validity by as much.
func TestSlowLostHookDelaysNoOtherLease(t *testing.T) {
	clk := clock.NewFake(time.Unix(1000, 0))
	held := make(chan struct{})
	var once atomic.Bool
	c := fenced.NewClient(mem.New(&mem.Options{Clock: clk}), &fenced.Options{Clock: clk, Hook: func(e fenced.Event) {
		if e.Kind == fenced.EventLost && e.Lease.Key() == "first" && once.CompareAndSwap(false, true) {
			<-held
		}
	}})
	defer c.Close()
	defer close(held)
	ctx := context.Background()
	manual := &fenced.LeaseOptions{TTL: time.Second, ManualRenew: true}
	first, err := c.TryAcquire(ctx, "first", manual)
	if err != nil {
		t.Fatal(err)
	}
	second, err := c.TryAcquire(ctx, "second", &fenced.LeaseOptions{TTL: 2 * time.Second, ManualRenew: true})
	if err != nil {
		t.Fatal(err)
	}
	waitTimers(t, clk, 1)
	clk.Advance(time.Second)
	select {
	case <-first.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the first lease did not end at its validity")
	}
	for deadline := time.Now().Add(5 * time.Second); !once.Load(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first lease's Lost hook did not run")
		}
	}
	// The first lease's hook now holds whichever goroutine runs it.
	clk.Advance(time.Second)
	select {
	case <-second.Context().Done():
	case <-time.After(3 * time.Second):
		t.Fatalf("the second lease's context is live %v past its ValidUntil while the first lease's Lost hook runs", clk.Now().Sub(rootaccess.ValidUntil(second)))
	}
}
