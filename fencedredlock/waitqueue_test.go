package fencedredlock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/fencedredlock"
	"github.com/fenced-dev/fenced/internal/rediskit"
	"github.com/fenced-dev/fenced/internal/testkit/waketest"
)

// TestReleaseWakesOneProcess checks Redlock's waiter queues: three waiting
// processes, refused on every node, stand in each node's queue under one
// member; each release wakes exactly one of them (the one first in the
// queues, so every node wakes the same one), each one only once, none
// once the queues are empty; and a process whose last waiter leaves takes
// itself off every node's queue.
func TestReleaseWakesOneProcess(t *testing.T) {
	ctx := ctxT(t)
	c := startCluster(t, 3)
	holder := c.open(t, c.nodes, fencedredlock.Options{})
	grant := func() driver.Grant { return waketest.Grant(t, ctx, holder, "job") }
	queue := rediskit.DefaultPrefix + "{job}:waitq"
	queued := func(want int64) {
		t.Helper()
		for i, n := range c.nodes {
			if got, err := client(t, n).ZCard(ctx, queue).Result(); err != nil || got != want {
				t.Fatalf("node %d: waiter queue %s holds %d processes (%v), want %d", i, queue, got, err, want)
			}
		}
	}
	g := grant()
	var subs []driver.Subscription
	for range 3 {
		subs = append(subs, waketest.Refused(t, ctx, c.open(t, c.nodes, fencedredlock.Options{}), "job"))
		time.Sleep(5 * time.Millisecond) // distinct places in the queues
	}
	queued(3)
	waketest.OnePerRelease(t, subs, func(int) {
		if err := holder.Release(ctx, g); err != nil {
			t.Fatal(err)
		}
		g = grant()
	})
	queued(0)

	// A process whose waiter leaves takes itself off every queue.
	w := c.open(t, c.nodes, fencedredlock.Options{})
	s, err := w.Subscribe(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.TryAcquire(ctx, "job", owner(), time.Minute); !errors.Is(err, driver.ErrHeld) {
		t.Fatalf("try of a held key: %v", err)
	}
	queued(1)
	s.Close()
	for deadline := time.Now().Add(10 * time.Second); ; {
		left := 0
		for _, n := range c.nodes {
			left += int(client(t, n).ZCard(ctx, queue).Val())
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d queue entries left 10 s after the last waiter closed", left)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
