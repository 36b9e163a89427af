package fencedredis_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/fencedredis"
	"github.com/fenced-dev/fenced/internal/core/storeurl"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
	"github.com/redis/go-redis/v9"
)

func TestOpenErrors(t *testing.T) {
	ctx := testCtx(t)
	srv := testenv.StartRedis(t, testenv.RedisConfig{Password: "hunter2-secret"})

	c, err := fenced.Open(ctx, srv.URL(), nil)
	if err != nil {
		t.Fatalf("Open(%s): %v", storeurl.Redact(srv.URL()), err)
	}
	c.Close()

	wrong := strings.Replace(srv.URL(), "hunter2-secret", "wrong-secret", 1)
	_, err = fenced.Open(ctx, wrong, nil)
	if err == nil || !strings.Contains(err.Error(), "authentication failed") {
		t.Fatalf("Open with a wrong password: %v, want an authentication error", err)
	}
	if strings.Contains(err.Error(), "wrong-secret") {
		t.Fatalf("error reveals the password: %v", err)
	}
	noPass := "redis://" + srv.Addr() + "/0"
	if _, err := fenced.Open(ctx, noPass, nil); err == nil || !strings.Contains(err.Error(), "authentication failed") {
		t.Fatalf("Open without the password: %v, want an authentication error", err)
	}

	dead := testenv.Addr(testenv.FreePort(t))
	_, err = fenced.Open(ctx, "redis://:pw@"+dead+"/0?dial_timeout=500ms", nil)
	if !errors.Is(err, fenced.ErrUnavailable) || !strings.Contains(err.Error(), dead) {
		t.Fatalf("Open of an unreachable server: %v, want ErrUnavailable naming %s", err, dead)
	}
	t.Logf("unreachable: %v", err)

	_, err = fenced.Open(ctx, "redis://"+srv.Addr()+"/0?wait_replicas=two", nil)
	if !errors.Is(err, fenced.ErrInvalidURL) || !strings.Contains(err.Error(), "wait_replicas") {
		t.Fatalf("Open with a malformed option: %v, want ErrInvalidURL naming it", err)
	}
}

// TestForeignValuesAreLeftAlone plants values fenced did not write where
// its keys live and checks that every operation refuses them clearly and
// leaves them as they were.
func TestForeignValuesAreLeftAlone(t *testing.T) {
	ctx := testCtx(t)
	srv := testenv.StartRedis(t, testenv.RedisConfig{})
	rc := admin(t, srv)
	d := newDriver(t, srv, nil)
	c := fenced.NewClient(newDriver(t, srv, nil), &fenced.Options{MinFence: fenced.FenceRepeatable})
	defer c.Close()

	plant := map[string]func(k string) error{
		"string lock":   func(k string) error { return rc.Set(ctx, "fenced:{"+k+"}:lock", "someone else's token", 0).Err() },
		"list lock":     func(k string) error { return rc.RPush(ctx, "fenced:{"+k+"}:lock", "x").Err() },
		"text counter":  func(k string) error { return rc.Set(ctx, "fenced:{"+k+"}:fence", "not-a-number", 0).Err() },
		"hash counter":  func(k string) error { return rc.HSet(ctx, "fenced:{"+k+"}:fence", "f", "1").Err() },
		"numeric owner": func(k string) error { return rc.Set(ctx, "fenced:{"+k+"}:lock", "12345", 0).Err() },
	}
	for name, put := range plant {
		t.Run(name, func(t *testing.T) {
			key := "foreign:" + strings.ReplaceAll(name, " ", "-")
			if err := put(key); err != nil {
				t.Fatal(err)
			}
			before := dump(t, rc, key)
			_, err := d.TryAcquire(ctx, key, owner(), time.Minute)
			if !errors.Is(err, fencedredis.ErrForeignValue) || !strings.Contains(err.Error(), key) {
				t.Fatalf("TryAcquire: %v, want ErrForeignValue naming the key", err)
			}
			if errors.Is(err, fenced.ErrHeld) {
				t.Fatalf("a foreign value must not look like a lease a waiter can wait out: %v", err)
			}
			// A waiting client fails at once instead of waiting forever.
			start := time.Now()
			if _, err := c.Acquire(ctx, key, &fenced.LeaseOptions{MaxWait: 10 * time.Second}); !errors.Is(err, fencedredis.ErrForeignValue) {
				t.Fatalf("Acquire: %v, want ErrForeignValue", err)
			}
			if time.Since(start) > 5*time.Second {
				t.Fatalf("Acquire waited %v on a foreign value", time.Since(start))
			}
			if _, err := d.Break(ctx, key, "test", "test"); err == nil {
				t.Fatal("Break of a foreign value succeeded")
			}
			d.Release(ctx, driver.Grant{Key: key, Owner: "someone else's token", Fence: 0})
			d.Renew(ctx, driver.Grant{Key: key, Owner: "x", Fence: 1, TTL: time.Minute})
			if _, err := d.Inspect(ctx, key); err == nil {
				t.Fatal("Inspect of a foreign value succeeded")
			}
			if after := dump(t, rc, key); after != before {
				t.Fatalf("foreign data changed:\nbefore %s\nafter  %s", before, after)
			}
		})
	}
}

// dump describes both Redis keys of a lease key, with types and TTLs.
func dump(t *testing.T, rc *redis.Client, key string) string {
	ctx := context.Background()
	var b strings.Builder
	for _, k := range []string{"fenced:{" + key + "}:lock", "fenced:{" + key + "}:fence"} {
		v, err := rc.Dump(ctx, k).Result()
		ttl := rc.PTTL(ctx, k).Val()
		fmt.Fprintf(&b, "%s=%q/%v/%v ", k, v, err, ttl > 0)
	}
	return b.String()
}

// TestHeldErrorCarriesPTTL checks the hint the portable layer uses to wake
// a waiter when a grant expires without a release.
func TestHeldErrorCarriesPTTL(t *testing.T) {
	ctx := testCtx(t)
	srv := testenv.StartRedis(t, testenv.RedisConfig{})
	d := newDriver(t, srv, nil)
	if _, err := d.TryAcquire(ctx, "k", owner(), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	_, err := d.TryAcquire(ctx, "k", owner(), 5*time.Second)
	var held *fenced.HeldError
	if !errors.As(err, &held) || held.Remaining <= 3*time.Second || held.Remaining > 5*time.Second {
		t.Fatalf("second acquire: %#v, want a HeldError with about 5s remaining", err)
	}
}

// countingHook counts what go-redis sends: single commands and pipelines,
// each one round trip.
type countingHook struct{ trips, cmds atomic.Int64 }

func (h *countingHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *countingHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.trips.Add(1)
		h.cmds.Add(1)
		return next(ctx, cmd)
	}
}
func (h *countingHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.trips.Add(1)
		h.cmds.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// TestRoundTrips counts the round trips of acquire, renew, release and a
// batched renewal of 50 leases.
func TestRoundTrips(t *testing.T) {
	ctx := testCtx(t)
	srv := testenv.StartRedis(t, testenv.RedisConfig{})
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	defer rc.Close()
	d, err := fencedredis.New(rc, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	// Load the scripts first: a cold server costs one extra EVAL once.
	o := owner()
	f, _ := d.TryAcquire(ctx, "warm", o, time.Minute)
	g := driver.Grant{Key: "warm", Owner: o, Fence: f, TTL: time.Minute}
	d.Renew(ctx, g)
	d.Release(ctx, g)
	d.RenewBatch(ctx, []driver.Grant{g})

	h := &countingHook{}
	rc.AddHook(h)
	trips := func(what string, want int64, op func()) {
		t.Helper()
		before := h.trips.Load()
		op()
		if got := h.trips.Load() - before; got != want {
			t.Errorf("%s took %d round trips, want %d", what, got, want)
		}
	}
	var grants []driver.Grant
	trips("acquire", 1, func() { f, err = d.TryAcquire(ctx, "one", o, time.Minute) })
	if err != nil {
		t.Fatal(err)
	}
	g = driver.Grant{Key: "one", Owner: o, Fence: f, TTL: time.Minute}
	trips("renew", 1, func() { err = d.Renew(ctx, g) })
	trips("release", 1, func() { err = d.Release(ctx, g) })
	for i := 0; i < 50; i++ {
		k := fmt.Sprintf("batch:%d", i)
		f, err := d.TryAcquire(ctx, k, o, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		grants = append(grants, driver.Grant{Key: k, Owner: o, Fence: f, TTL: time.Minute})
	}
	grants[7].Fence++ // one stale grant in the batch
	var errs []error
	trips("renewal of 50 leases", 1, func() { errs, err = d.RenewBatch(ctx, grants) })
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range errs {
		if (i == 7) != errors.Is(e, fenced.ErrNotHeld) || (i != 7 && e != nil) {
			t.Errorf("batch result %d: %v", i, e)
		}
	}
}

// TestTLS opens a rediss:// URL against a server that only speaks TLS.
func TestTLS(t *testing.T) {
	ctx := testCtx(t)
	srv := testenv.StartRedis(t, testenv.RedisConfig{TLS: true, Password: "tls-pw"})
	c, err := fenced.Open(ctx, srv.URL(), &fenced.Options{MinFence: fenced.FenceRepeatable})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.TryAcquire(ctx, "tls", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Plain redis:// to the TLS port fails clearly.
	plain := "redis://:tls-pw@" + srv.Addr() + "/0?dial_timeout=1s&read_timeout=1s"
	if _, err := fenced.Open(ctx, plain, nil); err == nil {
		t.Fatal("plain-text Open of a TLS-only server succeeded")
	}
}

// A key's waiter queue ({KEY}:waitq) holding something another program
// wrote there (a string here) is refused like any foreign value: waiting
// for the key fails at once with ErrForeignValue naming the queue, and so
// does a release (the grant stays until its TTL, and the queue is left as
// it was), since it cannot tell the waiters. A waiter that was already
// waiting when the queue was replaced fails at its next try, its fallback
// poll (300 ms here): it does not go on polling. Before, the errors named
// the lock and fence keys, which hold nothing foreign.
func TestForeignWaiterQueueIsNamed(t *testing.T) {
	ctx := testCtx(t)
	srv := testenv.StartRedis(t, testenv.RedisConfig{NoPersistence: true})
	rc := admin(t, srv)
	holder := newDriver(t, srv, nil)
	opts := &fenced.Options{MinFence: fenced.FenceRepeatable, FallbackPoll: 300 * time.Millisecond}
	lease := &fenced.LeaseOptions{MinFence: fenced.FenceRepeatable, MaxWait: 20 * time.Second}
	named := func(err error, key string) bool {
		return errors.Is(err, fencedredis.ErrForeignValue) && strings.Contains(err.Error(), "fenced:{"+key+"}:waitq")
	}

	// Planted before anyone waits.
	if err := rc.Set(ctx, "fenced:{planted}:waitq", "someone else's", 0).Err(); err != nil {
		t.Fatal(err)
	}
	o := owner()
	f, err := holder.TryAcquire(ctx, "planted", o, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	c := fenced.NewClient(newDriver(t, srv, nil), opts)
	defer c.Close()
	start := time.Now()
	if _, err := c.Acquire(ctx, "planted", lease); !named(err, "planted") {
		t.Errorf("Acquire with a foreign waiter queue: %v\nwant ErrForeignValue naming the queue", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Acquire took %v to refuse a foreign waiter queue; want at once", took)
	}
	if err := holder.Release(ctx, driver.Grant{Key: "planted", Owner: o, Fence: f, TTL: time.Minute}); !named(err, "planted") {
		t.Errorf("Release with a foreign waiter queue: %v\nwant ErrForeignValue naming the queue", err)
	}
	if info, err := holder.Inspect(ctx, "planted"); err != nil || !info.Held || info.Fence != f {
		t.Errorf("after the refused release: %+v, %v; want the grant unchanged", info, err)
	}
	if v, err := rc.Get(ctx, "fenced:{planted}:waitq").Result(); err != nil || v != "someone else's" {
		t.Errorf("the foreign queue is now %q (%v); want it untouched", v, err)
	}

	// Replaced while a waiter waits.
	f, err = holder.TryAcquire(ctx, "replaced", o, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		_, err := c.Acquire(ctx, "replaced", lease)
		got <- err
	}()
	waitQueueLen(t, rc, "fenced:{replaced}:waitq", 1)
	if err := rc.Del(ctx, "fenced:{replaced}:waitq").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rc.Set(ctx, "fenced:{replaced}:waitq", "someone else's", 0).Err(); err != nil {
		t.Fatal(err)
	}
	replaced := time.Now()
	if err := holder.Release(ctx, driver.Grant{Key: "replaced", Owner: o, Fence: f, TTL: time.Minute}); !named(err, "replaced") {
		t.Errorf("Release with a foreign waiter queue: %v\nwant ErrForeignValue naming the queue", err)
	}
	err = <-got
	if !named(err, "replaced") {
		t.Errorf("the waiting Acquire: %v\nwant ErrForeignValue naming the queue", err)
	}
	t.Logf("the waiter failed %v after its queue was replaced (fallback poll 300ms): %v", time.Since(replaced).Round(time.Millisecond), err)
}
