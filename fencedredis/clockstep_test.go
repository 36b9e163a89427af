package fencedredis_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fence"
	"github.com/fenced-dev/fenced/fence/redisfence"
	"github.com/fenced-dev/fenced/internal/core/rootaccess"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// TestClockStepEndsGrantEarly reproduces the hazard the Redis backend
// declares with Capabilities.ClockStepSafe == false. A holds a lease; the
// server's wall clock steps forward by more than the TTL, so PX expiry
// ends A's grant at once while A's local validity, on A's monotonic clock,
// has almost the whole TTL left. B is granted the key with a higher fence:
// two holders overlap. The resource's guard (package fence, on another
// Redis server) still refuses A's write once B has claimed it.
func TestClockStepEndsGrantEarly(t *testing.T) {
	ctx := testCtx(t)
	clock := testenv.NewWallClock(t)
	srv := testenv.StartRedis(t, testenv.RedisConfig{Password: "s3cret", WallClock: clock})
	resource := testenv.StartRedis(t, testenv.RedisConfig{})

	// No automatic renewal: A keeps trusting its first grant until local
	// validity runs out, as a holder between two renewals does. The TTL is
	// long only so that a loaded machine cannot end A's local validity
	// before B's grant; nothing waits for it.
	opts := &fenced.LeaseOptions{TTL: 20 * time.Second, ManualRenew: true, MinFence: fenced.FenceRepeatable}
	a := fenced.NewClient(newDriver(t, srv, nil), nil)
	defer a.Close()
	b := fenced.NewClient(newDriver(t, srv, nil), nil)
	defer b.Close()
	if g := a.Capabilities(); g.ClockStepSafe {
		t.Fatalf("Redis declares ClockStepSafe, but PX follows the server's wall clock: %+v", g)
	}

	la, err := a.TryAcquire(ctx, "ledger", opts)
	if err != nil {
		t.Fatal(err)
	}
	lock := "fenced:{ledger}:lock"
	before, err := admin(t, srv).PTTL(ctx, lock).Result()
	if err != nil {
		t.Fatal(err)
	}
	clock.Step(2 * opts.TTL)
	after, err := admin(t, srv).PTTL(ctx, lock).Result()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("A's grant at the server: PTTL %v before a %v forward step of its wall clock, PTTL reply %d after (-2: no such key)", before, 2*opts.TTL, after)

	lb, err := b.TryAcquire(ctx, "ledger", opts)
	if err != nil {
		t.Fatalf("B after a %v forward step of the server's clock: %v (PX did not follow the wall clock?)", 2*opts.TTL, err)
	}
	if overlap := time.Now(); la.Err() != nil || !overlap.Before(rootaccess.ValidUntil(la)) {
		t.Fatalf("A's local validity ended (%v, valid until %v) before B's grant: no overlap shown", la.Err(), rootaccess.ValidUntil(la))
	}
	t.Logf("two holders: A fence %d (locally valid for %v more), B fence %d", la.Fence(), time.Until(rootaccess.ValidUntil(la)).Round(time.Millisecond), lb.Fence())
	if lb.Fence() <= la.Fence() {
		t.Fatalf("B's fence %d is not above A's %d", lb.Fence(), la.Fence())
	}

	guard, err := redisfence.New(admin(t, resource), nil)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := guard.Claim(ctx, "account:1", fence.From(lb)); err != nil || !r.Applied() {
		t.Fatalf("B's claim: %+v, %v", r, err)
	}
	r, err := guard.Write(ctx, "account:1", fence.From(la), redisfence.Write{Set: []string{"balance", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	if r.Outcome != fence.Stale || !errors.Is(r.Err(), fenced.ErrStaleFence) || r.Current != lb.Fence() {
		t.Fatalf("A's write after B's claim: %+v (%v), want refused as stale with B's fence %d", r, r.Err(), lb.Fence())
	}
	if v, err := admin(t, resource).HGet(ctx, "account:1", "balance").Result(); err == nil {
		t.Fatalf("A's refused write left balance=%q", v)
	}
	if r, err := guard.Write(ctx, "account:1", fence.From(lb), redisfence.Write{Set: []string{"balance", "90"}}); err != nil || !r.Applied() {
		t.Fatalf("B's write: %+v, %v", r, err)
	}
	// A learns of the loss from the authority at its next renewal.
	if err := la.Renew(ctx); !errors.Is(err, fenced.ErrNotHeld) {
		t.Fatalf("A's renewal after B's grant: %v, want ErrNotHeld", err)
	}
	if err := lb.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
