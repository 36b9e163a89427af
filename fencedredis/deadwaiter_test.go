package fencedredis_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/fencedredis"
	"github.com/fenced-dev/fenced/internal/rediskit"
	"github.com/fenced-dev/fenced/internal/testkit/childproc"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
	"github.com/fenced-dev/fenced/internal/testkit/waketest"
	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) {
	childproc.Main(m, map[string]func() int{"wait": childWait})
}

// childWait is a process that waits for the key "job" on the server at
// REDIS_ADDR: it subscribes, is refused once (so it stands in the key's
// waiter queue), prints "waiting", and waits to be killed.
func childWait() int {
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR"), MaxRetries: -1})
	d, err := fencedredis.New(c, nil)
	if err != nil {
		return childproc.Fail(err)
	}
	if _, err := d.Subscribe(ctx, "job"); err != nil {
		return childproc.Fail(err)
	}
	if _, err := d.TryAcquire(ctx, "job", "child", time.Minute); !errors.Is(err, driver.ErrHeld) {
		return childproc.Fail(err)
	}
	os.Stdout.WriteString("waiting\n")
	select {}
}

// A waiting process killed with SIGKILL leaves its entry first in the
// waiter queue, for the holder's PTTL plus a second. The release's
// publish to it reaches no client (its subscriber connection closed with
// it), so the same script wakes the next process: the live waiter is woken
// by that release, within four times the slowest wake-up of a live first
// waiter measured in this run plus 50 ms. Before, the dead process took
// the wake-up, and the live waiter slept until its fallback timer (1.3 to
// 1.7 s through the Client; here, with no timer, until the next release).
func TestKilledFirstWaiterIsPassedOver(t *testing.T) {
	ctx := testCtx(t)
	srv := testenv.StartRedis(t, testenv.RedisConfig{NoPersistence: true})
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { rc.Close() })
	holder := newDriver(t, srv, nil)

	// The control: a live first waiter's wake-up, the slowest of three.
	var control time.Duration
	w := newDriver(t, srv, nil)
	o := owner()
	f, err := holder.TryAcquire(ctx, "control", o, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	s := waketest.Refused(t, ctx, w, "control")
	for n := range 3 {
		if n > 0 {
			if f, err = holder.TryAcquire(ctx, "control", o, time.Minute); err != nil {
				t.Fatal(err)
			}
			if _, err := w.TryAcquire(ctx, "control", owner(), time.Minute); !errors.Is(err, driver.ErrHeld) {
				t.Fatalf("try of the held control key: %v", err)
			}
		}
		start := time.Now()
		if err := holder.Release(ctx, driver.Grant{Key: "control", Owner: o, Fence: f, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
		if !waketest.Woken(s, 10*time.Second) {
			t.Fatal("the control release did not wake its waiter")
		}
		control = max(control, time.Since(start))
	}

	f, err = holder.TryAcquire(ctx, "job", o, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	child := testenv.Start(t, "waiter", childproc.Command("wait", "REDIS_ADDR="+srv.Addr()))
	child.WaitLog(t, "waiting", 20*time.Second)
	// The queue is ordered by when entries lapse: renewed for longer,
	// the grant makes the live waiter's entry lapse after the child's.
	if err := holder.Renew(ctx, driver.Grant{Key: "job", Owner: o, Fence: f, TTL: 2 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	live := waketest.Refused(t, ctx, newDriver(t, srv, nil), "job")
	queue := rediskit.DefaultPrefix + "{job}:waitq"
	waitQueueLen(t, rc, queue, 2)
	first, err := rc.ZRange(ctx, queue, 0, 0).Result()
	if err != nil || len(first) != 1 {
		t.Fatalf("first in the queue: %v, %v", first, err)
	}
	hub, _, _ := strings.Cut(first[0], ":")
	channel := rediskit.DefaultPrefix + "{job}:free:" + hub
	if err := child.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-child.Exited()
	// The server sees the killed process's connections close as soon as
	// it reads them; a release in between reaches the dead connection
	// (and is lost as before).
	killed := time.Now()
	waitFor(t, "the server to drop the killed waiter's subscription (it is first in the queue)", func() bool {
		n, err := rc.PubSubNumSub(ctx, channel).Result()
		return err == nil && n[channel] == 0
	})
	t.Logf("the server dropped the killed waiter's subscription %v after its exit", time.Since(killed).Round(100*time.Microsecond))

	bound := 4*control + 50*time.Millisecond
	start := time.Now()
	if err := holder.Release(ctx, driver.Grant{Key: "job", Owner: o, Fence: f, TTL: 2 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	if !waketest.Woken(live, 10*time.Second) {
		t.Fatal("the release did not wake the live waiter behind a killed one")
	}
	took := time.Since(start)
	t.Logf("live waiter woken %v after the release began (control: a live first waiter within %v; bound %v)", took.Round(100*time.Microsecond), control.Round(100*time.Microsecond), bound.Round(100*time.Microsecond))
	if took > bound {
		t.Errorf("the live waiter was woken %v after the release, behind a killed waiter; want within %v", took, bound)
	}
	if n, err := rc.ZCard(ctx, queue).Result(); err != nil || n != 0 {
		t.Errorf("waiter queue after the release: %d members (%v); want none (the dead entry and the woken one taken off)", n, err)
	}
}
