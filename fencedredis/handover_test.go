package fencedredis_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/fencedredis"
	"github.com/fenced-dev/fenced/internal/backend/rediskit"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
	"github.com/fenced-dev/fenced/internal/testkit/waketest"
	"github.com/redis/go-redis/v9"
)

// publishes reads how many PUBLISH commands the server has run.
func publishes(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	s, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(s, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_publish:calls="); ok {
			calls, _, _ := strings.Cut(rest, ",")
			n, err := strconv.ParseInt(calls, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	return 0
}

// TestReleasePublishesOnlyForWaiters: a release that nobody waits for
// publishes nothing; a refused try of a subscribed process puts it in the
// key's waiter queue, so the next release publishes twice (on the
// process's own channel, which wakes it, and on the key's, for
// observers) and takes it off the queue.
func TestReleasePublishesOnlyForWaiters(t *testing.T) {
	ctx := testCtx(t)
	srv := testenv.StartRedis(t, testenv.RedisConfig{NoPersistence: true})
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { rc.Close() })
	holder, waiter := newDriver(t, srv, nil), newDriver(t, srv, nil)
	grant := func() driver.Grant { return waketest.Grant(t, ctx, holder, "job") }
	release := func(g driver.Grant, wantPublished int64) {
		t.Helper()
		before := publishes(t, rc)
		if err := holder.Release(ctx, g); err != nil {
			t.Fatal(err)
		}
		if got := publishes(t, rc) - before; got != wantPublished {
			t.Fatalf("release published %d times, want %d", got, wantPublished)
		}
	}
	release(grant(), 0)

	sub, err := waiter.Subscribe(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	g := grant()
	if _, err := waiter.TryAcquire(ctx, "job", owner(), time.Minute); !errors.Is(err, fenced.ErrHeld) {
		t.Fatalf("try of a held key: %v", err)
	}
	release(g, 2)
	if !waketest.Woken(sub, 10*time.Second) {
		t.Fatal("the refused, subscribed waiter was not woken by the release")
	}
	release(grant(), 0) // the release took it off the queue
}

// TestReleaseWakesOneProcess: three processes (drivers, each with its own
// hub) wait for one key, each refused once. Each release wakes exactly one
// of them and takes it off the key's waiter queue, so three releases wake
// the three in turn and a fourth wakes nobody. A process whose last
// waiter leaves takes itself off the queue. (Before the queue, every
// release woke every process with a waiter: 64 waiting processes made a
// handover 14.5 times as slow as with one.)
func TestReleaseWakesOneProcess(t *testing.T) {
	ctx := testCtx(t)
	srv := testenv.StartRedis(t, testenv.RedisConfig{NoPersistence: true})
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { rc.Close() })
	holder := newDriver(t, srv, nil)
	grant := func() driver.Grant { return waketest.Grant(t, ctx, holder, "job") }
	g := grant()
	var subs []driver.Subscription
	for range 3 {
		subs = append(subs, waketest.Refused(t, ctx, newDriver(t, srv, nil), "job"))
	}
	queue := rediskit.DefaultPrefix + "{job}:waitq"
	if n, err := rc.ZCard(ctx, queue).Result(); err != nil || n != 3 {
		t.Fatalf("waiter queue %s holds %d processes (%v), want 3", queue, n, err)
	}
	waketest.OnePerRelease(t, subs, func(int) {
		if err := holder.Release(ctx, g); err != nil {
			t.Fatal(err)
		}
		g = grant()
	}, nil)

	// A process whose waiter leaves takes itself off the queue.
	w := newDriver(t, srv, nil)
	s, err := w.Subscribe(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.TryAcquire(ctx, "job", owner(), time.Minute); !errors.Is(err, fenced.ErrHeld) {
		t.Fatalf("try of a held key: %v", err)
	}
	if n, _ := rc.ZCard(ctx, queue).Result(); n != 1 {
		t.Fatalf("waiter queue holds %d processes after a refusal, want 1", n)
	}
	s.Close()
	waitQueueLen(t, rc, queue, 0)

	// A process woken whose waiter gives up instead of trying passes the
	// wake-up on to the next process in the queue.
	quitter, stayer := newDriver(t, srv, nil), newDriver(t, srv, nil)
	qs, err := quitter.Subscribe(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	ss, err := stayer.Subscribe(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	for _, d := range []*fencedredis.Driver{quitter, stayer} {
		if _, err := d.TryAcquire(ctx, "job", owner(), time.Minute); !errors.Is(err, fenced.ErrHeld) {
			t.Fatalf("try of a held key: %v", err)
		}
	}
	if err := holder.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	first, second := qs, ss
	if !waketest.Woken(qs, 10*time.Second) {
		first, second = ss, qs // the queue woke the other one first
		if !waketest.Woken(ss, 10*time.Millisecond) {
			t.Fatal("the release woke neither process")
		}
	}
	first.Close() // gives up without trying
	if !waketest.Woken(second, 10*time.Second) {
		t.Fatal("the wake-up of a process whose waiter gave up was not passed on to the next process")
	}
	qs.Close()
}

// TestDeadFirstWaiterIsPassedOver: the process first in the waiter queue
// is gone (an entry standing for 30 s that no process listens for, as a
// killed waiter leaves). The release's publish to it reaches nobody, so
// the same script wakes the next process: the live waiter, a Client whose
// fallback poll is a minute, takes the key at once. Before, the dead
// entry took the wake-up and the live waiter slept until its fallback
// poll. TestKilledFirstWaiterIsPassedOver kills a real waiting process.
func TestDeadFirstWaiterIsPassedOver(t *testing.T) {
	ctx := testCtx(t)
	srv := testenv.StartRedis(t, testenv.RedisConfig{NoPersistence: true})
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { rc.Close() })
	holder := newDriver(t, srv, nil)
	o := owner()
	f, err := holder.TryAcquire(ctx, "job", o, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	queue := rediskit.DefaultPrefix + "{job}:waitq"
	now, err := rc.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	// Stands 30 s: first, ahead of the live waiter (PTTL plus a second).
	if err := rc.ZAdd(ctx, queue, redis.Z{Score: float64(now.Add(30 * time.Second).UnixMilli()), Member: "deadbeefdeadbeef:1"}).Err(); err != nil {
		t.Fatal(err)
	}
	c := fenced.NewClient(newDriver(t, srv, nil), &fenced.Options{MinFence: fenced.FenceRepeatable, FallbackPoll: time.Minute})
	defer c.Close()
	got := make(chan error, 1)
	var at time.Time // when the acquire returned; read after got
	go func() {
		l, err := c.Acquire(ctx, "job", &fenced.LeaseOptions{TTL: time.Minute, MinFence: fenced.FenceRepeatable, MaxWait: 30 * time.Second})
		at = time.Now()
		if err == nil {
			l.Release(ctx)
		}
		got <- err
	}()
	waitQueueLen(t, rc, queue, 2)
	released := time.Now()
	if err := holder.Release(ctx, driver.Grant{Key: "job", Owner: o, Fence: f, TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	// Far below the minute of the fallback poll (and of the grant's PTTL,
	// which the waiter's timer also uses), whatever the machine's load.
	took := at.Sub(released)
	if took > 10*time.Second {
		t.Fatalf("the live waiter took the key %v after the release, behind a dead first waiter; want it woken by the release", took)
	}
	t.Logf("live waiter took the key %v after the release", took.Round(time.Millisecond))
}

// waitQueueLen waits up to 5 s for queue to hold n members.
func waitQueueLen(t *testing.T, rc *redis.Client, queue string, n int64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, err := rc.ZCard(context.Background(), queue).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiter queue %s holds %d members 5s on, want %d", queue, got, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestHandoverStrandsNoWaiter: waiters in two processes (two Clients),
// several per process, take one key in turn many times. Their fallback
// poll and backoff are a minute, so a release that failed to wake a
// waiter that needs it would show as an acquire waiting about a minute
// (or the test timing out), and the grants (TTL one minute) never expire
// on their own: every handover is a notification.
func TestHandoverStrandsNoWaiter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	srv := testenv.StartRedis(t, testenv.RedisConfig{NoPersistence: true})
	const processes, perProcess, rounds = 2, 6, 8
	slow := &fenced.Options{FallbackPoll: time.Minute, MinBackoff: time.Minute, MaxBackoff: time.Minute}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		longest time.Duration
		holders int
		fences  []uint64
	)
	errc := make(chan error, processes*perProcess)
	for p := 0; p < processes; p++ {
		c := fenced.NewClient(newDriver(t, srv, nil), slow)
		defer c.Close()
		for w := 0; w < perProcess; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for r := 0; r < rounds; r++ {
					start := time.Now()
					l, err := c.Acquire(ctx, "hot", &fenced.LeaseOptions{TTL: time.Minute, MinFence: fenced.FenceRepeatable, MaxWait: fenced.WaitForever, ManualRenew: true})
					if err != nil {
						errc <- fmt.Errorf("acquire: %w", err)
						return
					}
					mu.Lock()
					longest = max(longest, time.Since(start))
					holders++
					if holders != 1 {
						mu.Unlock()
						errc <- errors.New("two holders at once")
						return
					}
					fences = append(fences, l.Fence())
					mu.Unlock()
					time.Sleep(time.Millisecond)
					mu.Lock()
					holders--
					mu.Unlock()
					if err := l.Release(ctx); err != nil {
						errc <- fmt.Errorf("release: %w", err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	for i := 1; i < len(fences); i++ {
		if fences[i] <= fences[i-1] {
			t.Fatalf("fence %d after %d", fences[i], fences[i-1])
		}
	}
	t.Logf("%d grants, longest acquire %v", len(fences), longest)
	if longest > 20*time.Second {
		t.Fatalf("an acquire waited %v with %d waiters holding for 1ms each: a release failed to wake it", longest, processes*perProcess-1)
	}
}

// TestSubscribeAroundRelease: a waiter in a process with no subscription
// is refused (by the cheap acquire, which writes no waiters mark), then
// subscribes and tries again, as the Client does, while the holder
// releases at about that moment: before the subscription, between it and
// the retry, or after the retry. Whatever the order, the waiter either
// gets the key on its retry or is woken by the release; a release that
// published nothing can only have come before the retry, which then
// found the key free.
func TestSubscribeAroundRelease(t *testing.T) {
	ctx := testCtx(t)
	srv := testenv.StartRedis(t, testenv.RedisConfig{NoPersistence: true})
	holder, waiter := newDriver(t, srv, nil), newDriver(t, srv, nil)
	var grantedOnRetry, wokenByRelease int
	for i := 0; i < 300; i++ {
		key := fmt.Sprintf("job-%d", i)
		o := owner()
		f, err := holder.TryAcquire(ctx, key, o, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		g := driver.Grant{Key: key, Owner: o, Fence: f, TTL: time.Minute}
		if _, err := waiter.TryAcquire(ctx, key, owner(), time.Minute); !errors.Is(err, fenced.ErrHeld) {
			t.Fatalf("first try of a held key: %v, want ErrHeld", err)
		}
		released := make(chan error, 1)
		release := func() { released <- holder.Release(ctx, g) }
		// Rounds 0, 1, 2 (mod 4) release before the subscription, between
		// it and the retry, after the retry; round 3 races the release
		// against the subscription and retry.
		phase := i % 4
		if phase == 0 {
			release()
		}
		if phase == 3 {
			go func() {
				time.Sleep(time.Duration(i%7) * 50 * time.Microsecond)
				release()
			}()
		}
		sub, err := waiter.Subscribe(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if phase == 1 {
			release()
		}
		wo := owner()
		_, err = waiter.TryAcquire(ctx, key, wo, time.Minute)
		if phase == 2 {
			release()
		}
		if err := <-released; err != nil {
			t.Fatalf("round %d: release: %v", i, err)
		}
		switch {
		case err == nil:
			grantedOnRetry++
		case errors.Is(err, fenced.ErrHeld):
			if !waketest.Woken(sub, 10*time.Second) {
				t.Fatalf("round %d (phase %d): the waiter was refused after subscribing and the release did not wake it", i, phase)
			}
			wokenByRelease++
			if _, err := waiter.TryAcquire(ctx, key, wo, time.Minute); err != nil {
				t.Fatalf("round %d: try after the wake-up: %v", i, err)
			}
		default:
			t.Fatalf("round %d: retry: %v", i, err)
		}
		sub.Close()
	}
	t.Logf("granted on the retry %d times, woken by the release %d times", grantedOnRetry, wokenByRelease)
	if wokenByRelease < 75 {
		t.Fatalf("woken by the release only %d times: the rounds that release after the retry must all be", wokenByRelease)
	}
}
