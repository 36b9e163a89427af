package recipetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/drivertest"
	"github.com/fenced-dev/fenced/recipe"
)

// orphanTTL is the TTL of the permits testCancelledPermitAcquireLeavesNoGrant
// takes: an orphaned grant would hold its slot this long, far longer than
// orphanBound. The same as drivertest's for single keys.
const orphanTTL = 30 * time.Second

// orphanBound is how soon after a cancelled acquisition returns its slots
// must be free again: time for the client's bounded clean-up of a grant
// whose caller has gone, far under orphanTTL.
const orphanBound = 3 * time.Second

// testCancelledPermitAcquireLeavesNoGrant cancels semaphore acquisitions at
// random points around the release of the permits they wait for. A waiting
// Acquire races every slot and cancels the attempts that lose; a cancelled
// one gives up all of them. Each time, another client's TryAcquire must get
// every slot within orphanBound; an orphaned grant would hold it for its
// whole TTL. drivertest's CancelledAcquireLeavesNoGrant does the same for
// single keys.
func (s *suite) testCancelledPermitAcquireLeavesNoGrant(t *testing.T) {
	ctx := drivertest.Context(t)
	c := s.h.Client(t, &fenced.Options{MinBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	other := s.h.Client(t, nil)
	opts := &fenced.LeaseOptions{TTL: orphanTTL, MaxWait: time.Minute}
	rtt := grantTime(ctx, t, c, drivertest.Key("orphan"), opts)
	randomDelay := func(upTo time.Duration) time.Duration { return rand.N(upTo) }

	// checkFree fails t unless other gets key (and gives it back) within
	// orphanBound.
	checkFree := func(what string, key string) {
		t.Helper()
		deadline := time.Now().Add(orphanBound)
		for {
			l, err := other.TryAcquire(ctx, key, &fenced.LeaseOptions{TTL: orphanTTL})
			if err == nil {
				if err := l.Release(ctx); err != nil {
					t.Fatal(err)
				}
				return
			}
			if time.Now().After(deadline) {
				info, _ := other.Inspect(ctx, key)
				t.Fatalf("%s: key %s still held %v after the cancelled acquisitions returned (%+v): %v; a grant whose caller had gone was left to hold it for its %v TTL",
					what, key, orphanBound, info, err, orphanTTL)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	const permits = 3
	name := drivertest.Key("orphansem")
	sem, err := recipe.NewSemaphore(c, name, permits, opts)
	if err != nil {
		t.Fatal(err)
	}
	otherSem, err := recipe.NewSemaphore(other, name, permits, opts)
	if err != nil {
		t.Fatal(err)
	}
	for round := range 10 {
		var held []*recipe.Permit
		for range permits {
			// A cancelled acquisition's grant can appear after checkFree
			// saw its slot free (seen once in CI on PostgreSQL, for single
			// keys), and the client releases it within orphanBound.
			p, err := otherSem.TryAcquire(ctx)
			for deadline := time.Now().Add(orphanBound); errors.Is(err, fenced.ErrHeld) && time.Now().Before(deadline); {
				time.Sleep(10 * time.Millisecond)
				p, err = otherSem.TryAcquire(ctx)
			}
			if err != nil {
				t.Fatalf("semaphore round %d: a permit was not free %v after the last check: %v", round, orphanBound, err)
			}
			held = append(held, p)
		}
		var wg sync.WaitGroup
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				actx, cancel := context.WithCancel(ctx)
				defer cancel()
				time.AfterFunc(2*rtt+randomDelay(4*rtt), cancel)
				if p, err := sem.Acquire(actx); err == nil {
					_ = p.Release(ctx)
				}
			}()
		}
		time.Sleep(2*rtt + randomDelay(rtt))
		for _, p := range held {
			if err := p.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		wg.Wait()
		for slot := range permits {
			checkFree(fmt.Sprintf("semaphore round %d", round), recipe.PermitKey(name, slot))
		}
	}
}

// grantTime returns how long c takes to acquire key uncontended (the median
// of 5, at least 100µs), releasing each grant, so that cancellations can be
// timed to land around a grant.
func grantTime(ctx context.Context, t *testing.T, c *fenced.Client, key string, opts *fenced.LeaseOptions) time.Duration {
	t.Helper()
	var took []time.Duration
	for range 5 {
		began := time.Now()
		l, err := c.Acquire(ctx, key, opts)
		if err != nil {
			t.Fatal(err)
		}
		took = append(took, time.Since(began))
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(took)
	return max(took[len(took)/2], 100*time.Microsecond)
}
