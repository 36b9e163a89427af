package fencedpostgres_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/fencedpostgres"
)

// TestRenewBatchAtScale renews 3 000 grants in one statement, of which
// half are stale in every way a grant goes stale (released, taken by
// another owner, wrong fence, broken, expired), and checks each grant's
// result and what the batch left at each key.
func TestRenewBatchAtScale(t *testing.T) {
	ctx := ctxT(t)
	counter := &statementCounter{}
	cfg, err := pgxpool.ParseConfig(pg.URL("synchronous_commit=off"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = counter
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	d, err := fencedpostgres.New(ctx, pool, &fencedpostgres.Options{DisableNotify: true})
	if err != nil {
		t.Fatal(err)
	}
	const n = 3000
	const (
		current = iota
		released
		otherOwner
		wrongFence
		broken
		expired
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
	errc := make(chan error, 16)
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 16 {
				ttl := time.Minute
				if kind(i) == expired {
					ttl = 300 * time.Millisecond
				}
				k, o := fmt.Sprintf("%s:%d", t.Name(), i), fmt.Sprintf("owner-%d-%x", i, time.Now().UnixNano())
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
	others := map[int]uint64{}
	for i, g := range grants {
		reqs[i] = g
		reqs[i].TTL = 3 * time.Minute
		switch kind(i) {
		case released, otherOwner:
			if err := d.Release(ctx, g); err != nil {
				t.Fatal(err)
			}
			if kind(i) == otherOwner {
				f, err := d.TryAcquire(ctx, g.Key, "another owner", time.Minute)
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
		}
	}
	time.Sleep(400 * time.Millisecond) // the short grants expire

	before := counter.n.Load()
	errs, err := d.RenewBatch(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if got := counter.n.Load() - before; got != 1 {
		t.Errorf("renewing %d grants took %d statements, want 1", n, got)
	}
	if len(errs) != n {
		t.Fatalf("%d results for %d grants", len(errs), n)
	}
	bad := 0
	for i, e := range errs {
		g := reqs[i]
		if kind(i) == current && e != nil || kind(i) != current && !errors.Is(e, fenced.ErrNotHeld) {
			t.Errorf("grant %d (kind %d): %v", i, kind(i), e)
			bad++
		}
		info, err := d.Inspect(ctx, g.Key)
		if err != nil {
			t.Fatal(err)
		}
		switch kind(i) {
		case current:
			if !info.Held || info.Fence != g.Fence || info.Remaining < 2*time.Minute {
				t.Errorf("grant %d renewed for 3m: %+v", i, info)
				bad++
			}
		case otherOwner:
			if !info.Held || info.Fence != others[i] || info.Remaining > time.Minute {
				t.Errorf("grant %d: the other owner's grant was touched: %+v", i, info)
				bad++
			}
		case wrongFence:
			if !info.Held || info.Remaining > time.Minute {
				t.Errorf("grant %d: a renewal with the wrong fence extended the grant: %+v", i, info)
				bad++
			}
		default:
			if info.Held {
				t.Errorf("grant %d (kind %d): a stale renewal left the key held: %+v", i, kind(i), info)
				bad++
			}
		}
		if bad > 20 {
			t.FailNow()
		}
	}
}
