package recipe_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/recipe"
)

// TestAcquireAllFailsWhenAnEarlierLeaseWasBroken breaks k1 on SQLite
// while AcquireAll, holding k1, waits for k2 (held by another client),
// then lets k2 go: AcquireAll must not hand out a set with k1 lost, which
// k1's lease would learn of only at its renewal a third of its TTL
// later. It must fail naming k1, and leave k2 free.
func TestAcquireAllFailsWhenAnEarlierLeaseWasBroken(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs := openN(t, sqliteURL(t), 2)
	c, operator := cs[0], cs[1]
	opts := &fenced.LeaseOptions{TTL: 30 * time.Second, MaxWait: 20 * time.Second}
	k2, err := operator.TryAcquire(ctx, "k2", opts)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		set *recipe.LeaseSet
		err error
	}
	done := make(chan result, 1)
	go func() {
		set, err := recipe.AcquireAll(ctx, c, []string{"k2", "k1"}, opts)
		done <- result{set, err}
	}()
	// AcquireAll holds k1 and waits for k2.
	for {
		info, err := operator.Inspect(ctx, "k1")
		if err == nil && info.Held {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("AcquireAll never took k1")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := operator.Break(ctx, "k1", "test", "test"); err != nil {
		t.Fatal(err)
	}
	if err := k2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err == nil {
		err := r.set.Err()
		r.set.Release(ctx)
		t.Fatalf("AcquireAll returned a set although k1 was broken while it waited for k2 (set.Err() = %v)", err)
	}
	if !errors.Is(r.err, fenced.ErrNotHeld) && !fenced.IsLost(r.err) {
		t.Fatalf("AcquireAll = %v; want the loss of k1", r.err)
	}
	if l, err := operator.TryAcquire(ctx, "k2", opts); err != nil {
		t.Fatalf("k2 after the failed AcquireAll: %v; want free", err)
	} else {
		l.Release(ctx)
	}
}

// TestLeaseSetReflectsALossAtOnce checks that a set is unhealthy as soon
// as one of its leases is: once a member's Renew has reported the loss,
// the set's Err, Done and Context already say so.
func TestLeaseSetReflectsALossAtOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs := openN(t, sqliteURL(t), 2)
	c, operator := cs[0], cs[1]
	for range 20 {
		set, err := recipe.AcquireAll(ctx, c, []string{"a", "b"}, &fenced.LeaseOptions{TTL: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := operator.Break(ctx, "a", "test", "test"); err != nil {
			t.Fatal(err)
		}
		lease := set.Leases()[0]
		if err := lease.Renew(ctx); !errors.Is(err, fenced.ErrNotHeld) {
			t.Fatalf("renewal of the broken lease: %v", err)
		}
		if err := set.Err(); !fenced.IsLost(err) {
			t.Fatalf("set.Err() right after its lease on a was lost = %v; want the loss", err)
		}
		select {
		case <-set.Context().Done():
		default:
			t.Fatal("set.Context().Done() not closed right after its lease on a was lost")
		}
		if set.Context().Err() == nil {
			t.Fatal("set.Context().Err() = nil right after its lease on a was lost")
		}
		set.Release(ctx)
	}
}
