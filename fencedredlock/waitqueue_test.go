package fencedredlock_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/fencedredlock"
	"github.com/fenced-dev/fenced/internal/rediskit"
	"github.com/fenced-dev/fenced/internal/testkit/waketest"
	"github.com/redis/go-redis/v9"
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

// TestDeadFirstWaiterIsPassedOver: on every node the process first in the
// waiter queue is gone (an entry standing for 30 s that no client listens
// for, as a killed waiter leaves). Each node's release publishes to it,
// reaches no client, and wakes the next process in the same script: the
// live waiter behind it is woken by the release, within four times the
// slowest wake-up of a live first waiter measured in this run plus 50 ms.
// Before, the dead entry took every node's wake-up and the live waiter
// slept until its fallback timer (here, with no timer, the next release).
func TestDeadFirstWaiterIsPassedOver(t *testing.T) {
	ctx := ctxT(t)
	c := startCluster(t, 3)
	holder := c.open(t, c.nodes, fencedredlock.Options{})
	live := c.open(t, c.nodes, fencedredlock.Options{})
	measure := func(key string, dead bool) time.Duration {
		t.Helper()
		g := waketest.Grant(t, ctx, holder, key)
		if dead {
			queue := rediskit.DefaultPrefix + "{" + key + "}:waitq"
			for _, n := range c.nodes {
				rc := client(t, n)
				now, err := rc.Time(ctx).Result()
				if err != nil {
					t.Fatal(err)
				}
				if err := rc.ZAdd(ctx, queue, redis.Z{Score: float64(now.Add(30 * time.Second).UnixMilli()), Member: "deadbeefdeadbeef:1"}).Err(); err != nil {
					t.Fatal(err)
				}
			}
		}
		s := waketest.Refused(t, ctx, live, key)
		defer s.Close()
		start := time.Now()
		if err := holder.Release(ctx, g); err != nil {
			t.Fatal(err)
		}
		if !waketest.Woken(s, 10*time.Second) {
			t.Fatalf("the release of %s did not wake the live waiter (dead first waiter: %v)", key, dead)
		}
		return time.Since(start)
	}
	var control time.Duration
	for i := range 3 {
		control = max(control, measure(fmt.Sprintf("control:%d", i), false))
	}
	took := measure("job", true)
	bound := 4*control + 50*time.Millisecond
	t.Logf("live waiter woken %v after the release began (control: a live first waiter within %v; bound %v)", took.Round(100*time.Microsecond), control.Round(100*time.Microsecond), bound.Round(100*time.Microsecond))
	if took > bound {
		t.Errorf("the live waiter was woken %v after the release, behind a dead waiter; want within %v", took, bound)
	}
}
