package fencedredis_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/fencedredis"
	"github.com/fenced-dev/fenced/internal/backend/rediskit"
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
	if _, err := d.TryAcquire(ctx, "job", "child", time.Minute); !errors.Is(err, fenced.ErrHeld) {
		return childproc.Fail(err)
	}
	os.Stdout.WriteString("waiting\n")
	select {}
}

// controlWake measures how long after a release begins a live waiter,
// first in the queue of a key of its own, is woken: the control for the
// wake-ups passed on past dead or stopped processes. It returns the
// slowest of three.
func controlWake(t *testing.T, ctx context.Context, srv *testenv.Redis, holder *fencedredis.Driver) time.Duration {
	t.Helper()
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
			if _, err := w.TryAcquire(ctx, "control", owner(), time.Minute); !errors.Is(err, fenced.ErrHeld) {
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
	return control
}

// behindFirstWaiter runs a waiting process (childWait) first in the
// queue of the key "job", held by holder, and a live waiter in this
// process behind it; fault is done to the child, then the key released.
// It returns how long after the release began the live waiter was woken
// (failing the test if it was not within 10 s), how long the release
// took, and how late a timer started with the release fired.
func behindFirstWaiter(t *testing.T, ctx context.Context, srv *testenv.Redis, holder *fencedredis.Driver, fault func(child *testenv.Process, channel string)) (took, release, lateness time.Duration) {
	t.Helper()
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { rc.Close() })
	o := owner()
	f, err := holder.TryAcquire(ctx, "job", o, time.Minute)
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
	if n, err := rc.PubSubNumSub(ctx, channel).Result(); err != nil || n[channel] != 1 {
		t.Fatalf("first in the queue: %s, whose channel has %v subscribers (%v); want the child's, one", first[0], n, err)
	}
	fault(child, channel)
	// A timer of NudgeMin started with the release, in this process,
	// which runs the holder's nudge: how late it fires is how late the
	// nudge's own timer may fire on this machine now.
	probe := make(chan time.Duration, 1)
	go func() {
		t0 := time.Now()
		time.Sleep(fencedredis.NudgeMin)
		probe <- time.Since(t0) - fencedredis.NudgeMin
	}()
	start := time.Now()
	if err := holder.Release(ctx, driver.Grant{Key: "job", Owner: o, Fence: f, TTL: 2 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	release = time.Since(start)
	if !waketest.Woken(live, 10*time.Second) {
		t.Fatal("the release did not wake the live waiter behind the first")
	}
	return time.Since(start), release, <-probe
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
	holder := newDriver(t, srv, nil)
	control := controlWake(t, ctx, srv, holder)
	took, _, _ := behindFirstWaiter(t, ctx, srv, holder, func(child *testenv.Process, channel string) {
		rc := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
		defer rc.Close()
		if err := child.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-child.Exited()
		// The server sees the killed process's connections close as soon
		// as it reads them; a release in between reaches the dead
		// connection (and is lost as before).
		killed := time.Now()
		waitFor(t, "the server to drop the killed waiter's subscription", func() bool {
			n, err := rc.PubSubNumSub(ctx, channel).Result()
			return err == nil && n[channel] == 0
		})
		t.Logf("the server dropped the killed waiter's subscription %v after its exit", time.Since(killed).Round(100*time.Microsecond))
	})
	bound := 4*control + 50*time.Millisecond
	t.Logf("live waiter woken %v after the release began (control: a live first waiter within %v; bound %v)", took.Round(100*time.Microsecond), control.Round(100*time.Microsecond), bound.Round(100*time.Microsecond))
	if took > bound {
		t.Errorf("the live waiter was woken %v after the release, behind a killed waiter; want within %v", took, bound)
	}
}

// A waiting process stopped with SIGSTOP still holds its connection, which
// takes the release's wake-up. The releasing driver's nudge finds the key
// still free a moment later (NudgeMin plus four of the release's round
// trips) and wakes the next process. The live waiter is woken within
// NudgeMin, plus four times the release's duration (the nudge waits four
// of its round trips), plus four times the larger of the release's
// duration and the slowest wake-up of a live first waiter measured in
// this run (for the nudge's script and its wake-up, with slack), plus four
// times the most this process's timers were seen late from the first
// waiter's stop to the wake-up (the nudge's timer, the script's reply,
// the publish and the waiter's own wake-up each wait for a CPU on a busy
// machine; one timer started with the release, sampled alone, missed a
// 247 ms stall under the hog), plus 50 ms. Before, it slept until its
// fallback timer (here, with no timer, until the next release).
func TestStoppedFirstWaiterIsPassedOn(t *testing.T) {
	ctx := testCtx(t)
	srv := testenv.StartRedis(t, testenv.RedisConfig{NoPersistence: true})
	holder := newDriver(t, srv, nil)
	control := controlWake(t, ctx, srv, holder)
	var sched *testenv.Lateness
	took, rel, late := behindFirstWaiter(t, ctx, srv, holder, func(child *testenv.Process, _ string) {
		if err := child.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { child.Signal(syscall.SIGCONT) })
		sched = testenv.SampleLateness()
	})
	sched.Stop()
	late = max(late, sched.Max())
	bound := fencedredis.NudgeMin + 4*rel + 4*max(rel, control) + 4*late + 50*time.Millisecond
	t.Logf("live waiter woken %v after the release began (the release took %v; control: a live first waiter within %v; timers seen up to %v late; bound %v)", took.Round(100*time.Microsecond), rel.Round(100*time.Microsecond), control.Round(100*time.Microsecond), late.Round(100*time.Microsecond), bound.Round(100*time.Microsecond))
	if took > bound {
		t.Errorf("the live waiter was woken %v after the release, behind a stopped waiter; want within %v", took, bound)
	}
}
