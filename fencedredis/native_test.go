package fencedredis_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/fencedredis"
	"github.com/fenced-dev/fenced/internal/backend/rediskit"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// nativeOf is the path a server of version v has, by its release notes:
// Redis 8.4 and Valkey 8.1 added SET IFEQ. The driver probes for it; this
// says what the probe must find.
func nativeOf(v testenv.ServerVersion) rediskit.Native {
	return rediskit.Native{SetIfEq: v.Name == "redis" && v.AtLeast(8, 4) || v.Name == "valkey" && v.AtLeast(8, 1)}
}

// commandCalls returns the server's call counts by command (INFO
// commandstats), commands run by scripts included.
func commandCalls(t *testing.T, c *redis.Client) map[string]int {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		n, _ := strconv.Atoi(strings.SplitN(rest, ",", 2)[0])
		out[strings.TrimPrefix(name, "cmdstat_")] = n
	}
	return out
}

// TestNativeCommands checks that renewal takes the path the server has
// (Commands says which, and the server's command counts show it was
// taken), and that on it a renewal of a grant that is not the key's, or
// after its release, is refused, the renewal resets the expiry, and the
// grant's fence strictly increases, as on the scripts.
func TestNativeCommands(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisConfig{})
	v := testenv.RedisVersion(t)
	want := nativeOf(v)
	d := newDriver(t, srv, nil)
	ctx := context.Background()
	if got := d.Commands(ctx); got != want.String() {
		t.Fatalf("%v: Commands() = %q, want %q", v, got, want)
	}
	t.Logf("%v: %s", v, want)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer c.Close()
	before := commandCalls(t, c)
	const rounds = 20
	var last uint64
	o := owner()
	for i := range rounds {
		f, err := d.TryAcquire(ctx, "k", o, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if f <= last {
			t.Fatalf("round %d: fence %d after %d, want it strictly increasing", i, f, last)
		}
		g := driver.Grant{Key: "k", Owner: o, Fence: f, TTL: time.Minute}
		if err := d.Renew(ctx, g); err != nil {
			t.Fatalf("round %d: renew: %v", i, err)
		}
		stale := g
		stale.Fence = f + 1
		if err := d.Renew(ctx, stale); !errors.Is(err, fenced.ErrNotHeld) {
			t.Fatalf("round %d: renew of a grant that is not the key's: %v, want ErrNotHeld", i, err)
		}
		if err := d.Release(ctx, stale); !errors.Is(err, fenced.ErrNotHeld) {
			t.Fatalf("round %d: release of a grant that is not the key's: %v, want ErrNotHeld", i, err)
		}
		if pttl := c.PTTL(ctx, "fenced:{k}:lock").Val(); pttl < 50*time.Second {
			t.Fatalf("round %d: the renewed lock has %v left, want about a minute", i, pttl)
		}
		if err := d.Release(ctx, g); err != nil {
			t.Fatalf("round %d: release: %v", i, err)
		}
		if err := d.Release(ctx, g); !errors.Is(err, fenced.ErrNotHeld) {
			t.Fatalf("round %d: second release: %v, want ErrNotHeld", i, err)
		}
		if err := d.Renew(ctx, g); !errors.Is(err, fenced.ErrNotHeld) {
			t.Fatalf("round %d: renew after release: %v, want ErrNotHeld", i, err)
		}
		last = f
	}
	after := commandCalls(t, c)
	calls := func(cmd string) int { return after[cmd] - before[cmd] }
	// Renewals by script call PEXPIRE (lua/renew.lua), native ones SET.
	if want.SetIfEq && (calls("pexpire") != 0 || calls("set") < 3*rounds) ||
		!want.SetIfEq && calls("pexpire") != rounds {
		t.Errorf("%v: %d PEXPIRE and %d SET calls for %d rounds, not %s", v, calls("pexpire"), calls("set"), rounds, want)
	}
}

// TestNativeFallsBackToScripts replaces a server that has the conditional
// commands by Debian's Redis 7.0, which has none, on the same port (as a
// failover to an older server would): the driver, which probed the first
// one, renews and releases by script from its first refused command on.
func TestNativeFallsBackToScripts(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisConfig{NoPersistence: true})
	v := testenv.RedisVersion(t)
	if !nativeOf(v).SetIfEq {
		t.Logf("%v has no conditional commands: the scripts are the only path (TestNativeCommands)", v)
		return
	}
	// Two drivers, both probed on the first server: the first meets the
	// older server with a renewal, the second with a release (a script on
	// every server) and then a renewal.
	renewer, releaser := newDriver(t, srv, nil), newDriver(t, srv, nil)
	ctx := context.Background()
	o := owner()
	grants := map[*fencedredis.Driver]driver.Grant{}
	for i, d := range []*fencedredis.Driver{renewer, releaser} {
		if d.Commands(ctx) != nativeOf(v).String() {
			t.Fatalf("%v: Commands() = %q", v, d.Commands(ctx))
		}
		key := "k" + strconv.Itoa(i)
		f, err := d.TryAcquire(ctx, key, o, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		grants[d] = driver.Grant{Key: key, Owner: o, Fence: f, TTL: time.Minute}
	}
	srv.Kill()
	<-srv.Exited()
	old := testenv.StartRedis(t, testenv.RedisConfig{NoPersistence: true, Port: srv.Port, Dir: srv.Config.Dir,
		Binary: testenv.RequireBinary(t, "redis-server", "redis-server")})
	if ov := testenv.BinaryVersion(t, old.Cmd.Path); nativeOf(ov).SetIfEq {
		t.Fatalf("Debian's redis-server is %v, which has the conditional commands: this test needs an older one", ov)
	}
	// The grants went with the first server's memory: the renewal, sent
	// as SET IFEQ, is refused as a syntax error, and its script then says
	// the grant is gone, as does the release.
	for d, call := range map[*fencedredis.Driver]func(context.Context, driver.Grant) error{
		renewer: renewer.Renew, releaser: releaser.Release,
	} {
		var err error
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if err = call(ctx, grants[d]); errors.Is(err, fenced.ErrNotHeld) {
				break // other errors: the old server is not reachable yet
			}
		}
		if !errors.Is(err, fenced.ErrNotHeld) {
			t.Fatalf("first call on the older server: %v, want ErrNotHeld", err)
		}
		f, err := d.TryAcquire(ctx, "again", o, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		g := driver.Grant{Key: "again", Owner: o, Fence: f, TTL: time.Minute}
		if err := d.Renew(ctx, g); err != nil {
			t.Fatalf("renewal by script: %v", err)
		}
		if err := d.Release(ctx, g); err != nil {
			t.Fatalf("release by script: %v", err)
		}
		if got, want := d.Commands(ctx), (rediskit.Native{}).String(); got != want {
			t.Fatalf("after the older server refused SET IFEQ: Commands() = %q, want %q", got, want)
		}
	}
}

// TestNativeRenewalRefusedAfterExpiryAndRegrant forces, on the server's
// own clock, the sequence a starved holder meets: its grant expires, the
// key is granted again (to another owner, or to the same owner by an
// acquisition that retried), and then the old holder's renewal arrives.
// On every path (SET IFEQ where the server has it, the script elsewhere)
// the renewal must be refused, and the new grant's value and expiry left
// as they were: SET IFEQ compares the whole value, fence included, which
// no two grants share.
func TestNativeRenewalRefusedAfterExpiryAndRegrant(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisConfig{NoPersistence: true})
	v := testenv.RedisVersion(t)
	old, other := newDriver(t, srv, nil), newDriver(t, srv, nil)
	ctx := context.Background()
	if got, want := old.Commands(ctx), nativeOf(v).String(); got != want {
		t.Fatalf("%v: Commands() = %q, want %q", v, got, want)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer c.Close()
	const lock = "fenced:{k}:lock"
	for _, sameOwner := range []bool{false, true} {
		o := owner()
		const ttl = 100 * time.Millisecond
		f, err := old.TryAcquire(ctx, "k", o, ttl)
		if err != nil {
			t.Fatal(err)
		}
		g := driver.Grant{Key: "k", Owner: o, Fence: f, TTL: time.Minute}
		// Expired on the server's clock: PTTL reports -2 once the key is
		// past its expiry (and deletes it).
		for c.PTTL(ctx, lock).Val() != -2 {
			time.Sleep(10 * time.Millisecond)
		}
		o2 := owner()
		if sameOwner {
			o2 = o
		}
		f2, err := other.TryAcquire(ctx, "k", o2, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if f2 <= f {
			t.Fatalf("regrant fence %d after %d", f2, f)
		}
		value := c.Get(ctx, lock).Val()
		if err := c.PExpire(ctx, lock, 30*time.Second).Err(); err != nil {
			t.Fatal(err)
		}
		if err := old.Renew(ctx, g); !errors.Is(err, fenced.ErrNotHeld) {
			t.Fatalf("%v (same owner %v): the expired grant's renewal after the regrant: %v, want ErrNotHeld", v, sameOwner, err)
		}
		if errs, err := old.RenewBatch(ctx, []driver.Grant{g, g}); err != nil || !errors.Is(errs[0], fenced.ErrNotHeld) {
			t.Fatalf("%v (same owner %v): the expired grant's batch renewal after the regrant: %v, %v, want ErrNotHeld", v, sameOwner, errs, err)
		}
		if got := c.Get(ctx, lock).Val(); got != value {
			t.Fatalf("%v (same owner %v): the new grant's value is %q after the old renewal, was %q", v, sameOwner, got, value)
		}
		if pttl := c.PTTL(ctx, lock).Val(); pttl > 30*time.Second {
			t.Fatalf("%v (same owner %v): the new grant's expiry was moved to %v by the old holder's renewal", v, sameOwner, pttl)
		}
		if err := other.Release(ctx, driver.Grant{Key: "k", Owner: o2, Fence: f2, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
}
