package fencedredlock_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/fencedredlock"
	"github.com/fenced-dev/fenced/internal/rediskit"
)

func woken(s driver.Subscription, within time.Duration) bool {
	select {
	case <-s.C():
		return true
	case <-time.After(within):
		return false
	}
}

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
	grant := func() driver.Grant {
		t.Helper()
		o := owner()
		f, err := holder.TryAcquire(ctx, "job", o, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return driver.Grant{Key: "job", Owner: o, Fence: f, TTL: time.Minute}
	}
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
		w := c.open(t, c.nodes, fencedredlock.Options{})
		s, err := w.Subscribe(ctx, "job")
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if _, err := w.TryAcquire(ctx, "job", owner(), time.Minute); !errors.Is(err, driver.ErrHeld) {
			t.Fatalf("try of a held key: %v", err)
		}
		subs = append(subs, s)
		time.Sleep(5 * time.Millisecond) // distinct places in the queues
	}
	queued(3)
	wokenBefore := map[int]bool{}
	for round := range 4 {
		if err := holder.Release(ctx, g); err != nil {
			t.Fatal(err)
		}
		// Wait (up to 10 s under load) for the first wake-up, then give
		// the others 300 ms to show a second one.
		var woke []int
		for deadline := time.Now().Add(10 * time.Second); len(woke) == 0 && round < 3 && time.Now().Before(deadline); {
			for i, s := range subs {
				if woken(s, 10*time.Millisecond) {
					woke = append(woke, i)
					break
				}
			}
		}
		// Every node wakes the process first in its queue, so the process
		// woken may hear the release up to three times (coalesced, but
		// spread over time): drain those too.
		for deadline := time.Now().Add(300 * time.Millisecond); time.Now().Before(deadline); {
			for i, s := range subs {
				if woken(s, time.Millisecond) && !slices.Contains(woke, i) {
					woke = append(woke, i)
				}
			}
		}
		switch {
		case round < 3 && len(woke) != 1:
			t.Fatalf("release %d woke processes %v, want exactly one", round+1, woke)
		case round < 3 && wokenBefore[woke[0]]:
			t.Fatalf("release %d woke process %d again, which had left the queues", round+1, woke[0])
		case round == 3 && len(woke) != 0:
			t.Fatalf("release 4 woke processes %v with the queues empty", woke)
		}
		for _, i := range woke {
			wokenBefore[i] = true
		}
		g = grant()
	}
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
