package drivertest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
)

// orphanTTL is the TTL of the grants testCancelledAcquireLeavesNoGrant
// makes: an orphaned grant would hold the key this long, far longer than
// orphanBound.
const orphanTTL = 30 * time.Second

// orphanBound is how soon after a cancelled acquisition returns the key
// must be free again: time for the client's bounded clean-up of a grant
// whose caller has gone, far under orphanTTL.
const orphanBound = 3 * time.Second

// testCancelledAcquireLeavesNoGrant cancels acquisitions at random points:
// before, while and after their grant requests are in flight. It checks that
// a grant whose caller has gone is released. Each time, another client's
// TryAcquire must get the key within orphanBound; an orphaned grant would
// hold it for its whole TTL. It does so for a lone acquisition of a free key
// and for waiters cancelled around the release of the key they wait for
// (recipe/recipetest does so for semaphore permits).
func (s *suite) testCancelledAcquireLeavesNoGrant(t *testing.T) {
	ctx := Context(t)
	c := s.h.Client(t, &fenced.Options{MinBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	other := s.h.Client(t, nil)
	key := Key("orphan")
	opts := &fenced.LeaseOptions{TTL: orphanTTL, MaxWait: time.Minute}

	// How long an uncontended grant takes, so cancellations land around it.
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
	rtt := max(took[len(took)/2], 100*time.Microsecond)
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
	// acquireCancelled acquires key under a context cancelled after
	// delay, and releases what it got.
	acquireCancelled := func(key string, delay time.Duration) error {
		actx, cancel := context.WithCancel(ctx)
		defer cancel()
		timer := time.AfterFunc(delay, cancel)
		defer timer.Stop()
		l, err := c.Acquire(actx, key, opts)
		if err != nil {
			return nil
		}
		return l.Release(ctx)
	}

	for i := range 40 {
		if err := acquireCancelled(key, randomDelay(2*rtt)); err != nil {
			t.Fatal(err)
		}
		checkFree(fmt.Sprintf("lone acquisition %d", i), key)
	}

	const waiters = 8
	for round := range 6 {
		// A cancelled acquisition's grant can still appear after checkFree
		// saw the key free (seen once in CI on PostgreSQL; how the store
		// applied it that late was not found); the client releases such a
		// grant within orphanBound, so the holder waits that long for it.
		holder, err := other.Acquire(ctx, key, &fenced.LeaseOptions{TTL: orphanTTL, MaxWait: orphanBound})
		if err != nil {
			t.Fatalf("waiters of round %d: the key was not free %v after the last check: %v", round, orphanBound, err)
		}
		var wg sync.WaitGroup
		errs := make(chan error, waiters)
		start := make(chan struct{})
		for range waiters {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				errs <- acquireCancelled(key, 3*rtt+randomDelay(4*rtt))
			}()
		}
		close(start)
		// Release while the waiters' cancellations are due.
		time.Sleep(3*rtt + randomDelay(rtt))
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		checkFree(fmt.Sprintf("waiters of round %d", round), key)
	}
}
