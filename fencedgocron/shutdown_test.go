package fencedgocron_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedgocron"
)

// TestShutdownKeepsTheMinimumHold: a scheduler that shuts down right after
// a run (gocron cancels the job's context) still keeps the run's lease
// for its minimum hold, so that another instance whose tick comes a little
// later skips it; Wait returns once the lease is released. Before, the
// cancelled context cut the hold short, and the late instance ran the
// tick again (TestThreeSchedulersRunEachTickOnce, under load).
func TestShutdownKeepsTheMinimumHold(t *testing.T) {
	file := "sqlite://" + filepath.Join(t.TempDir(), "leases.db")
	open := func() *fencedgocron.Locker {
		c, err := fenced.Open(context.Background(), file, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		lk, err := fencedgocron.NewLocker(c, &fencedgocron.Options{Lease: fenced.LeaseOptions{MinHold: minHold}})
		if err != nil {
			t.Fatal(err)
		}
		return lk
	}
	a, b := open(), open()
	var granted time.Time
	var key string
	for round := 1; ; round++ {
		key = fmt.Sprintf("tick-%d", round)
		job, stop := context.WithCancel(context.Background())
		lock, err := a.Lock(job, key)
		if err != nil {
			t.Fatal(err)
		}
		granted = time.Now()
		if err := lock.Unlock(job); err != nil {
			t.Fatal(err)
		}
		stop() // the scheduler shuts down
		time.Sleep(100 * time.Millisecond)
		late, err := b.Lock(context.Background(), key)
		if since := time.Since(granted); since >= minHold && round < 3 {
			// Past the hold a grant is right: too busy to tell. Again.
			t.Logf("round %d: the late instance's Lock ended %v after the grant, past the %v hold; again", round, since, minHold)
			if late != nil {
				late.Unlock(context.Background())
			}
			continue
		}
		if since := time.Since(granted); since >= minHold {
			t.Fatalf("the late instance's Lock ended %v after the grant, past the %v hold, in 3 rounds: too busy to tell", since, minHold)
		}
		if !errors.Is(err, fenced.ErrHeld) {
			t.Fatalf("a late instance's Lock after the shutdown: %v, want ErrHeld (the hold was cut short)", err)
		}
		break
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // liveness only
	defer cancel()
	if err := a.Wait(ctx); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if held := time.Since(granted); held < minHold {
		t.Fatalf("Wait returned %v after the grant, before the %v hold ended", held, minHold)
	}
	lk, err := b.Lock(context.Background(), key)
	if err != nil {
		t.Fatalf("Lock after Wait: %v, want the key free", err)
	}
	lk.Unlock(context.Background())
}

// minHold is TestShutdownKeepsTheMinimumHold's hold: long beside a Lock
// on a loaded machine (under 200ms at a load of 30 on 2 cores).
const minHold = 3 * time.Second
