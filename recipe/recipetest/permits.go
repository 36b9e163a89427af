package recipetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/drivertest"
	"github.com/fenced-dev/fenced/recipe"
)

// testCancelledPermitAcquireLeavesNoGrant cancels semaphore acquisitions at
// random points around the release of the permits they wait for. A waiting
// Acquire races every slot and cancels the attempts that lose; a cancelled
// one gives up all of them. Each time, another client's TryAcquire must get
// every slot within drivertest.OrphanBound; an orphaned grant would hold it
// for its whole TTL. drivertest's CancelledAcquireLeavesNoGrant does the
// same for single keys.
func (s *suite) testCancelledPermitAcquireLeavesNoGrant(t *testing.T) {
	ctx := drivertest.Context(t)
	c := s.h.Client(t, &fenced.Options{MinBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	other := s.h.Client(t, nil)
	opts := &fenced.LeaseOptions{TTL: drivertest.OrphanTTL, MaxWait: time.Minute}
	rtt := drivertest.GrantTime(ctx, t, c, drivertest.Key("orphan"), opts)
	randomDelay := func(upTo time.Duration) time.Duration { return rand.N(upTo) }

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
			// A cancelled acquisition's grant can appear after CheckFree
			// saw its slot free (seen once in CI on PostgreSQL, for single
			// keys), and the client releases it within OrphanBound.
			p, err := otherSem.TryAcquire(ctx)
			for deadline := time.Now().Add(drivertest.OrphanBound); errors.Is(err, fenced.ErrHeld) && time.Now().Before(deadline); {
				time.Sleep(10 * time.Millisecond)
				p, err = otherSem.TryAcquire(ctx)
			}
			if err != nil {
				t.Fatalf("semaphore round %d: a permit was not free %v after the last check: %v", round, drivertest.OrphanBound, err)
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
			// The permit keys Semaphore documents.
			drivertest.CheckFree(ctx, t, other, fmt.Sprintf("semaphore round %d", round), name+"#"+strconv.Itoa(slot))
		}
	}
}
