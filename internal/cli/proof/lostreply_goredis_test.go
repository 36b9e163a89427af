package proof

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/fencedredis"
	"github.com/fenced-dev/fenced/internal/core/token"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// TestLostReplyGoRedisRetries is the one driver whose client library
// retries a write by itself: fencedredis.New over a go-redis client made
// by the user, which retries a command up to MaxRetries (3 by default)
// on a new connection when the reply is lost (the client fenced.Open makes
// from a URL sets MaxRetries -1). A's release or renewal is applied and its
// reply lost; go-redis's retry is held in the network until B holds the
// key (for the renewal: once A's renewed grant ran out), then delivered.
// The retry must neither delete B's grant nor extend it.
func TestLostReplyGoRedisRetries(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server")
	}
	r := testenv.StartRedis(t, testenv.RedisConfig{})
	direct := redis.NewClient(&redis.Options{Addr: r.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { direct.Close() })
	db, err := fencedredis.New(direct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	for _, op := range []string{"release", "renew"} {
		t.Run(op, func(t *testing.T) { goRedisRetry(t, r, db, op) })
	}
}

// goRedisRetry runs TestLostReplyGoRedisRetries for op on server r, with
// db a driver that reaches r directly.
func goRedisRetry(t *testing.T, r *testenv.Redis, db driver.Driver, op string) {
	const ttlA, ttlB = 2 * time.Second, time.Second
	p := testenv.StartProxy(t, r.Addr())
	c := redis.NewClient(&redis.Options{Addr: p.Addr, ContextTimeoutEnabled: true}) // MaxRetries: the default, 3
	t.Cleanup(func() { c.Close() })
	da, err := fencedredis.New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { da.Close() })
	// Load the scripts first: a script the server lacks is answered
	// NOSCRIPT and sent again in full, which would be the request cut.
	warm := driver.Grant{Key: lostReplyKey("warm"), Owner: fmt.Sprintf("%032x", 1), TTL: ttlA}
	if warm.Fence, err = da.TryAcquire(ctxFor(t, 5*time.Second), warm.Key, warm.Owner, ttlA); err != nil {
		t.Fatal(err)
	}
	if err := da.Renew(ctxFor(t, 5*time.Second), warm); err != nil {
		t.Fatal(err)
	}
	if err := da.Release(ctxFor(t, 5*time.Second), warm); err != nil {
		t.Fatal(err)
	}

	key := lostReplyKey("goredis-" + op)
	g1 := driver.Grant{Key: key, Owner: fmt.Sprintf("%032x", time.Now().UnixNano()), TTL: ttlA}
	if g1.Fence, err = da.TryAcquire(ctxFor(t, 5*time.Second), key, g1.Owner, ttlA); err != nil {
		t.Fatal(err)
	}
	names := func(chunk []byte) bool { return bytes.Contains(chunk, []byte(key)) }
	p.CutAfter(names)
	seen := 0 // under the proxy's lock
	p.Hold(func(chunk []byte) bool {
		if !names(chunk) {
			return false
		}
		seen++
		return seen > 1 // the first is the request cut; the rest are retries
	})
	done := make(chan error, 1)
	sent := time.Now()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
		defer cancel()
		if op == "release" {
			done <- da.Release(ctx, g1)
		} else {
			done <- da.Renew(ctx, g1)
		}
	}()
	for p.Held() == 0 {
		if time.Since(sent) > 5*time.Second {
			t.Fatalf("go-redis sent no retry of the %s whose reply was lost within 5s (cuts %d)", op, p.Cuts())
		}
		time.Sleep(time.Millisecond)
	}
	t.Logf("go-redis retried the %s on a new connection; the retry is held", op)
	// B acquires as soon as the store lets it: at once after the applied
	// release, a TTL after the applied renewal (bounded by twice that).
	ownerB := fmt.Sprintf("%032x", time.Now().UnixNano()+1)
	var f2 uint64
	for deadline := time.Now().Add(2 * ttlA); ; {
		if f2, err = db.TryAcquire(ctxFor(t, 5*time.Second), key, ownerB, ttlB); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("B could not acquire %q within %v of A's %s: %v", key, 2*ttlA, op, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if f2 <= g1.Fence {
		t.Fatalf("B's fence %d is not above A's %d", f2, g1.Fence)
	}
	held := p.Held()
	if err := p.ReleaseHeld(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("A's %s returned %v; %d held retries delivered after B's grant (fence %d)", op, <-done, held, f2)
	info, err := db.Inspect(ctxFor(t, 5*time.Second), key)
	if err != nil {
		t.Fatal(err)
	}
	if !info.Held || info.OwnerDigest != token.Digest(ownerB) || info.Fence != f2 {
		t.Fatalf("after go-redis's retries of A's %s reached the store: %+v; want B's grant (fence %d) intact", op, info, f2)
	}
	// A renewal of A's (TTL 2s) that reached B's grant would leave it
	// more than B's own 1s; Redis counts in milliseconds.
	if info.Remaining > ttlB {
		t.Fatalf("B's grant has %v left, more than its TTL %v: A's retried renewal extended it", info.Remaining, ttlB)
	}
}
