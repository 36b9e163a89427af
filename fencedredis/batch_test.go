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
	"github.com/redis/go-redis/v9"
)

// scriptCalls reads how many script calls (EVALSHA and EVAL) the server
// has run.
func scriptCalls(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	s, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, line := range strings.Split(s, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "cmdstat_evalsha" && name != "cmdstat_eval") {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		v, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		n += v
	}
	return n
}

// TestRenewBatchAtScale renews a batch of 2 000 grants of which a part is
// stale in every way a grant goes stale (released, taken by another owner,
// wrong fence, broken, expired, its key overwritten with another type),
// and checks each grant's result, what the batch left at each key, and
// that the server ran one script call per rediskit.RenewChunk grants.
func TestRenewBatchAtScale(t *testing.T) {
	ctx := testCtx(t)
	srv := testenv.StartRedis(t, testenv.RedisConfig{NoPersistence: true})
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, PoolSize: 32})
	t.Cleanup(func() { rc.Close() })
	d, err := fencedredis.New(rc, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })

	const n = 2000
	const (
		current = iota
		released
		otherOwner
		wrongFence
		broken
		expired
		foreign
		kinds
	)
	kind := func(i int) int { // half the grants are current
		if i%2 == 0 {
			return current
		}
		return 1 + (i/2)%(kinds-1)
	}
	grants := make([]driver.Grant, n)
	var wg sync.WaitGroup
	errc := make(chan error, n)
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 16 {
				ttl := time.Minute
				if kind(i) == expired {
					ttl = 300 * time.Millisecond
				}
				k, o := fmt.Sprintf("scale:%d", i), owner()
				f, err := d.TryAcquire(ctx, k, o, ttl)
				if err != nil {
					errc <- err
					return
				}
				grants[i] = driver.Grant{Key: k, Owner: o, Fence: f, TTL: ttl}
			}
		}()
	}
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	reqs := make([]driver.Grant, n)
	others := map[int]uint64{} // fence of the grant that replaced a released one
	for i, g := range grants {
		reqs[i] = g
		reqs[i].TTL = 3 * time.Minute
		switch kind(i) {
		case released, otherOwner:
			if err := d.Release(ctx, g); err != nil {
				t.Fatal(err)
			}
			if kind(i) == otherOwner {
				f, err := d.TryAcquire(ctx, g.Key, owner(), time.Minute)
				if err != nil {
					t.Fatal(err)
				}
				others[i] = f
			}
		case wrongFence:
			reqs[i].Fence++
		case broken:
			if _, err := d.Break(ctx, g.Key, "test", "test"); err != nil {
				t.Fatal(err)
			}
		case foreign:
			lock := rediskit.Layout{Prefix: rediskit.DefaultPrefix}.Keys(g.Key).Lock
			if err := rc.Del(ctx, lock).Err(); err != nil {
				t.Fatal(err)
			}
			if err := rc.HSet(ctx, lock, "someone", "else").Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	time.Sleep(400 * time.Millisecond) // the short grants expire

	// Load the script first: a cold server answers the first pipeline
	// with NOSCRIPT, and the driver sends it again.
	if _, err := d.RenewBatch(ctx, reqs[:1]); err != nil {
		t.Fatal(err)
	}
	before := scriptCalls(t, rc)
	errs, err := d.RenewBatch(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	calls := scriptCalls(t, rc) - before
	if want := int64((n + rediskit.RenewChunk - 1) / rediskit.RenewChunk); calls != want {
		t.Errorf("renewing %d grants ran %d script calls, want %d (%d grants a call)", n, calls, want, rediskit.RenewChunk)
	}
	if len(errs) != n {
		t.Fatalf("%d results for %d grants", len(errs), n)
	}
	for i, e := range errs {
		g := reqs[i]
		switch kind(i) {
		case current:
			if e != nil {
				t.Errorf("grant %d (current): %v, want renewed", i, e)
			}
		case foreign:
			if !errors.Is(e, fencedredis.ErrForeignValue) || errors.Is(e, fenced.ErrNotHeld) {
				t.Errorf("grant %d (key overwritten with a hash): %v, want ErrForeignValue and not ErrNotHeld", i, e)
			}
		default:
			if !errors.Is(e, fenced.ErrNotHeld) {
				t.Errorf("grant %d (kind %d): %v, want ErrNotHeld", i, kind(i), e)
			}
		}
		if t.Failed() && i > 50 {
			t.FailNow()
		}
		if kind(i) == foreign {
			continue
		}
		info, err := d.Inspect(ctx, g.Key)
		if err != nil {
			t.Fatal(err)
		}
		switch kind(i) {
		case current:
			if !info.Held || info.Fence != g.Fence || info.Remaining < 2*time.Minute {
				t.Errorf("grant %d renewed for 3m: %+v", i, info)
			}
		case otherOwner:
			if !info.Held || info.Fence != others[i] || info.Remaining > time.Minute {
				t.Errorf("grant %d: the other owner's grant was touched: %+v", i, info)
			}
		case wrongFence:
			if !info.Held || info.Remaining > time.Minute {
				t.Errorf("grant %d: a renewal with the wrong fence extended the grant: %+v", i, info)
			}
		default:
			if info.Held {
				t.Errorf("grant %d (kind %d): a stale renewal left the key held: %+v", i, kind(i), info)
			}
		}
	}
}

// TestRenewBatchFailsWhole: when the server is gone, a batch fails as a
// whole with an error that is never a refusal, and reports no per-grant
// results.
func TestRenewBatchFailsWhole(t *testing.T) {
	ctx := testCtx(t)
	srv := testenv.StartRedis(t, testenv.RedisConfig{NoPersistence: true})
	d := newDriver(t, srv, nil)
	var reqs []driver.Grant
	for i := 0; i < 600; i++ {
		k, o := fmt.Sprintf("whole:%d", i), owner()
		f, err := d.TryAcquire(ctx, k, o, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, driver.Grant{Key: k, Owner: o, Fence: f, TTL: time.Minute})
	}
	srv.Kill()
	errs, err := d.RenewBatch(ctx, reqs)
	if err == nil || errs != nil {
		t.Fatalf("RenewBatch against a dead server = %v, %v; want a whole-batch error", errs, err)
	}
	if errors.Is(err, fenced.ErrNotHeld) || !(errors.Is(err, fenced.ErrUnavailable) || errors.Is(err, fenced.ErrUnknownOutcome)) {
		t.Fatalf("whole-batch error %v: want ErrUnavailable or ErrUnknownOutcome, never ErrNotHeld", err)
	}
}
