package recipe_test

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/recipe"
)

// TestPartitionsNoTryOfListedHeld: a member whose targets are all held by
// another (here a holder with a member's tag of the same count, as a
// member paused past its membership would leave them) sends no request
// for them while its listing shows them held: it watches them and looks
// again at their release or expiry. Before, every step tried each of
// them, a refused write on a SQL store: under a load of 35-45 on 2 cores
// those writes took the lock the members' renewals wait for, the
// renewals missed the TTL, and TestPartitionsProofSQLite's group never
// settled ("not balanced ... owned [2 0 0 0 0]"). Once released, the
// partitions are taken within a poll.
func TestPartitionsNoTryOfListedHeld(t *testing.T) {
	ctx := context.Background()
	url := partStores(t)["sqlite"]
	holder := partOpen(t, url)
	var held []*fenced.Lease
	for p := range 4 {
		// "004" is P=4 in the tag's base 36: a member of the group's count.
		l, err := holder.TryAcquire(ctx, "tries/p/"+strconv.Itoa(p), &fenced.LeaseOptions{TTL: time.Minute, OwnerTag: "004zzzzz"})
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
	}
	var tries atomic.Int64
	c, err := fenced.Open(ctx, url, &fenced.Options{Hook: func(e fenced.Event) {
		if e.Kind == fenced.EventAttempt && strings.HasPrefix(e.Key, "tries/p/") {
			tries.Add(1)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const ttl = time.Second
	idle := func(ctx context.Context, p recipe.Partition) error { <-ctx.Done(); return nil }
	m, err := recipe.JoinPartitions(ctx, c, "tries", 4, idle, &recipe.PartitionsOptions{MemberID: "a", Lease: &fenced.LeaseOptions{TTL: ttl}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Leave(ctx)
	// Six polls (TTL/3 each), and the wake-ups of the joins' doorbell.
	time.Sleep(2 * ttl)
	if n := tries.Load(); n != 0 {
		t.Errorf("the member sent %d tries for partitions its listing showed held, in %v", n, 2*ttl)
	}
	for _, l := range held {
		l.Release(ctx)
	}
	released := time.Now()
	partBalanced(t, []*recipe.Partitions{m}, 4, 10*time.Second)
	t.Logf("took the 4 partitions %v after their release (poll %v); %d tries", time.Since(released).Round(time.Millisecond), ttl/3, tries.Load())
}
