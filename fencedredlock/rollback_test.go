package fencedredlock_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/fencedredlock"
	"github.com/fenced-dev/fenced/internal/backend/rediskit"
	"github.com/fenced-dev/fenced/internal/core/ttlrule"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
	"github.com/redis/go-redis/v9"
)

// The tests of this file make one Acquire's attempts (one owner token,
// as the Client's acquisition loop uses for all of them) interleave on a
// node: a request of a failed attempt is held on its way to the node (a
// slow link, or a node stopped with the request in its socket buffer)
// and executed only after a later attempt of the same owner was granted
// there and counted it. The later attempt's holder must keep its
// majority: a rival must not be granted the key.

const rollTTL = 30 * time.Second

// worthlessMargin makes every grant refused after its round (the drift
// allowance eats the whole TTL), so the attempt is granted on every node
// and then rolls back everywhere.
const worthlessMargin = rollTTL - time.Nanosecond

// openVia returns a driver over the nodes at addrs (a node's own address
// or a proxy's in front of it).
func openVia(t *testing.T, addrs []string, opts fencedredlock.Options) *fencedredlock.Driver {
	var cs []redis.UniversalClient
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a, Password: password, MaxRetries: -1, ContextTimeoutEnabled: true, DialTimeout: time.Second, DialerRetries: 1})
		t.Cleanup(func() { c.Close() })
		cs = append(cs, c)
	}
	d, err := fencedredlock.New(cs, &opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// warmUp makes every node run the acquire and the rollback scripts once,
// so they are cached there (later calls are EVALSHA, which the proxies
// recognise) and connections are open.
func warmUp(t *testing.T, ctx context.Context, c *cluster, d *fencedredlock.Driver) {
	for i := 0; ; i++ {
		_, err := d.TryAcquireTerms(ctx, "warm", owner(), rollTTL, worthlessMargin)
		if !errors.Is(err, fenced.ErrUnavailable) {
			t.Fatalf("warm-up attempt: %v, want ErrUnavailable", err)
		}
		clean := true
		for _, n := range c.nodes {
			if v, err := client(t, n).Exists(ctx, "fenced:{warm}:lock").Result(); err != nil || v != 0 {
				clean = false
			}
		}
		if clean && errors.Is(err, fenced.ErrUnavailable) && bytes.Contains([]byte(err.Error()), []byte("drift")) {
			return
		}
		if i == 20 {
			t.Fatalf("warm-up did not complete: %v", err)
		}
	}
}

// evalsha matches a chunk that runs a cached script.
func evalsha(chunk []byte) bool { return bytes.Contains(bytes.ToLower(chunk), []byte("evalsha")) }

// notAcquire matches a chunk that runs a cached script other than the
// grant.
func notAcquire(chunk []byte) bool {
	return evalsha(chunk) && !bytes.Contains(chunk, []byte(rediskit.AcquireNode.Hash()))
}

func waitHeld(t *testing.T, p *testenv.Proxy, n int) {
	deadline := time.Now().Add(10 * time.Second)
	for p.Held() < n {
		if time.Now().After(deadline) {
			t.Fatalf("proxy holds %d connections, want %d", p.Held(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// grant retries a normal attempt a few times (a loaded machine may miss
// the budget), as the acquisition loop would, with the same owner.
func grant(t *testing.T, ctx context.Context, d *fencedredlock.Driver, key, o string) driver.Grant {
	for i := 0; ; i++ {
		f, err := d.TryAcquireTerms(ctx, key, o, rollTTL, ttlrule.DefaultSafetyMargin(rollTTL))
		if err == nil {
			return driver.Grant{Key: key, Owner: o, Fence: f, TTL: rollTTL}
		}
		if i == 5 || errors.As(err, new(*fenced.HeldError)) {
			t.Fatalf("later attempt of the same owner: %v", err)
		}
		t.Logf("later attempt of the same owner failed, tried again: %v", err)
	}
}

// checkExclusive checks that g's holder still has a majority and that a
// rival is refused.
func checkExclusive(t *testing.T, ctx context.Context, c *cluster, opts fencedredlock.Options, d *fencedredlock.Driver, g driver.Grant) {
	for i, n := range c.nodes {
		v, _ := client(t, n).Get(ctx, "fenced:{"+g.Key+"}:lock").Result()
		t.Logf("node %d holds %q", i, v)
	}
	rival := c.open(t, c.nodes, opts)
	if f, err := rival.TryAcquire(ctx, g.Key, owner(), rollTTL); err == nil {
		t.Fatalf("a rival was granted fence %d while the holder of %v believes it holds a majority: two holders", f, g)
	} else if !errors.As(err, new(*fenced.HeldError)) {
		t.Fatalf("rival: %v, want a HeldError", err)
	}
	if err := d.Renew(ctx, g); err != nil {
		t.Fatalf("the holder's renewal: %v", err)
	}
}

func rollbackModes(t *testing.T, run func(t *testing.T, c *cluster, opts fencedredlock.Options)) {
	for _, withSource := range []bool{false, true} {
		t.Run(fmt.Sprintf("fenceSource=%v", withSource), func(t *testing.T) {
			c := startCluster(t, 3)
			opts := fencedredlock.Options{Budget: 300 * time.Millisecond}
			if withSource {
				opts.Fence = c.fenced(t).Fence
			}
			run(t, c, opts)
		})
	}
}

// TestLateRollbackSparesLaterAttempt: attempt 1 is granted on all three
// nodes but fails (its grant would be worth nothing), and its rollback to
// nodes 1 and 2 times out on the way. Attempt 2 of the same owner is
// granted there again (re-acquiring its own grant, so with a fence source
// it keeps attempt 1's fence) and counts both. Attempt 1's rollback then
// lands and must not delete what attempt 2 counted.
func TestLateRollbackSparesLaterAttempt(t *testing.T) {
	rollbackModes(t, func(t *testing.T, c *cluster, opts fencedredlock.Options) {
		ctx := ctxT(t)
		p1, p2 := testenv.StartProxy(t, c.nodes[1].Addr()), testenv.StartProxy(t, c.nodes[2].Addr())
		d := openVia(t, []string{c.nodes[0].Addr(), p1.Addr, p2.Addr}, opts)
		warmUp(t, ctx, c, d)

		p1.Hold(notAcquire)
		p2.Hold(notAcquire)
		o := owner()
		if _, err := d.TryAcquireTerms(ctx, "k", o, rollTTL, worthlessMargin); !errors.Is(err, fenced.ErrUnavailable) {
			t.Fatalf("attempt 1: %v, want ErrUnavailable", err)
		}
		waitHeld(t, p1, 1)
		waitHeld(t, p2, 1)
		p1.Hold(nil)
		p2.Hold(nil)

		g := grant(t, ctx, d, "k", o)
		for _, p := range []*testenv.Proxy{p1, p2} {
			if err := p.ReleaseHeld(10 * time.Second); err != nil {
				t.Fatal(err)
			}
		}
		checkExclusive(t, ctx, c, opts, d, g)
	})
}

// TestLateGrantAndRollbackSpareLaterAttempt: attempt 1 is granted on
// nodes 0 and 1 and fails (its grant would be worth nothing); its grant
// to node 2 and then the rollback sent there when that timed out are
// both held on the way. A rival takes node 1; attempt 2 of the same owner
// is granted on nodes 0 and 2, a bare majority. Then attempt 1's grant
// and rollback land on node 2, in that order, and the rival lets node 1
// go: attempt 2's holder must still be the only one.
func TestLateGrantAndRollbackSpareLaterAttempt(t *testing.T) {
	rollbackModes(t, func(t *testing.T, c *cluster, opts fencedredlock.Options) {
		ctx := ctxT(t)
		p2 := testenv.StartProxy(t, c.nodes[2].Addr())
		d := openVia(t, []string{c.nodes[0].Addr(), c.nodes[1].Addr(), p2.Addr}, opts)
		warmUp(t, ctx, c, d)

		p2.Hold(evalsha)
		o := owner()
		if _, err := d.TryAcquireTerms(ctx, "k", o, rollTTL, worthlessMargin); !errors.Is(err, fenced.ErrUnavailable) {
			t.Fatalf("attempt 1: %v, want ErrUnavailable", err)
		}
		waitHeld(t, p2, 2) // the grant, then the rollback of the late reply
		p2.Hold(nil)

		rivalOnOne := c.open(t, []*testenv.Redis{c.nodes[1]}, opts)
		ro := owner()
		rf, err := rivalOnOne.TryAcquire(ctx, "k", ro, rollTTL)
		if err != nil {
			t.Fatalf("rival on node 1: %v", err)
		}
		g := grant(t, ctx, d, "k", o)
		if err := p2.ReleaseHeld(10 * time.Second); err != nil {
			t.Fatal(err)
		}
		if err := rivalOnOne.Release(ctx, driver.Grant{Key: "k", Owner: ro, Fence: rf, TTL: rollTTL}); err != nil {
			t.Fatal(err)
		}
		checkExclusive(t, ctx, c, opts, d, g)
	})
}

// A re-acquire by the holding owner whose grants stand on two fences (on
// three nodes an earlier attempt's, on two a later one's, as when a
// request of the earlier attempt was still in flight) is granted on the
// fence a majority holds. Before, the round ended at the first three
// grants, whatever their fences, and failed when they were split: "2 of 5
// nodes granted it (need 3)", seen in the conformance suite.
func TestReacquireOnSplitFences(t *testing.T) {
	c := startCluster(t, 5)
	ctx := context.Background()
	// Not a test of the budget: a loaded machine may take longer than
	// the default 250ms to answer, and the grants must all be made.
	opts := c.fenced(t)
	opts.Budget = 10 * time.Second
	all := c.open(t, c.nodes, opts)
	first := c.open(t, c.nodes[:3], opts)
	second := c.open(t, c.nodes[3:], opts)
	for i := range 10 {
		key, owner := fmt.Sprintf("split:%d", i), fmt.Sprintf("owner-%d", i)
		f1, err := first.TryAcquire(ctx, key, owner, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		f2, err := second.TryAcquire(ctx, key, owner, time.Minute)
		if err != nil || f2 == f1 {
			t.Fatalf("the grant on the other two nodes: fence %d, %v; want a fence other than %d", f2, err, f1)
		}
		f, err := all.TryAcquire(ctx, key, owner, time.Minute)
		if err != nil || f != f1 {
			t.Fatalf("round %d: re-acquire by the holding owner: fence %d, %v; want fence %d, held on three of five nodes", i, f, err, f1)
		}
	}
}
