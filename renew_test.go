package fenced_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/clock"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/core/rootaccess"
	"github.com/fenced-dev/fenced/mem"
)

// batchSizes is a mem driver with driver.BatchRenewer that records the
// size of every batch it is given.
type batchSizes struct {
	*mem.Driver
	clock *clock.Fake // if set, the time of each key's last grant or renewal is kept
	mu    sync.Mutex
	sizes []int
	last  map[string]time.Time
}

func (b *batchSizes) TryAcquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	fence, err := b.Driver.TryAcquire(ctx, key, owner, ttl)
	if err == nil {
		b.note(key)
	}
	return fence, err
}

func (b *batchSizes) RenewBatch(ctx context.Context, grants []driver.Grant) ([]error, error) {
	b.mu.Lock()
	b.sizes = append(b.sizes, len(grants))
	b.mu.Unlock()
	errs := make([]error, len(grants))
	for i, g := range grants {
		if errs[i] = b.Driver.Renew(ctx, g); errs[i] == nil {
			b.note(g.Key)
		}
	}
	return errs, nil
}

func (b *batchSizes) note(key string) {
	if b.clock == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.last == nil {
		b.last = map[string]time.Time{}
	}
	b.last[key] = b.clock.Now()
}

// renewedWithin reports whether every key was granted or renewed less
// than d before now.
func (b *batchSizes) renewedWithin(now time.Time, d time.Duration) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, at := range b.last {
		if now.Sub(at) >= d {
			return false
		}
	}
	return true
}

// Capabilities declares the batches, which mem leaves off by default.
func (b *batchSizes) Capabilities() driver.Capabilities {
	c := b.Driver.Capabilities()
	c.BatchRenew = true
	return c
}

func (b *batchSizes) calls() []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]int(nil), b.sizes...)
}

// TestManyLeasesRenewInFewLargeBatches checks that a client holding many
// leases acquired at different moments renews them in batches of
// thousands (not one call per lease, and not one unbounded call), every
// lease once per period, and loses none.
func TestManyLeasesRenewInFewLargeBatches(t *testing.T) {
	const n = 6000
	clk := clock.NewFake(time.Unix(1000, 0))
	d := &batchSizes{Driver: mem.New(&mem.Options{Clock: clk}), clock: clk}
	c := fenced.NewClient(d, &fenced.Options{Clock: clk})
	defer c.Close()
	ctx := context.Background()
	var leases []*fenced.Lease
	for i := range n {
		l, err := c.TryAcquire(ctx, fmt.Sprintf("many:%05d", i), &fenced.LeaseOptions{TTL: 3 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
		if i%1000 == 999 {
			clk.Advance(80 * time.Millisecond) // acquired over half a second
		}
	}
	d.mu.Lock()
	granted := len(d.last)
	d.mu.Unlock()
	if granted != n {
		t.Fatalf("%d grants seen by the driver's TryAcquire, want %d: the wait below would see none due", granted, n)
	}
	// A tenth of a period at a time. After each step the test waits for
	// the client to renew what is due: every lease granted or renewed
	// within a period (TTL/3) of the fake now. A fixed sleep was too short
	// on a loaded machine (under the race detector), and renewals piled
	// up into fewer, later periods.
	for step := range 40 {
		clk.Advance(100 * time.Millisecond)
		for caughtUp := time.Now().Add(time.Minute); !d.renewedWithin(clk.Now(), time.Second); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(caughtUp) {
				t.Fatalf("step %d: leases due for renewal still unrenewed a minute later", step)
			}
		}
	}
	for _, l := range leases {
		if l.Err() != nil {
			t.Fatalf("%s ended: %v", l.Key(), l.Err())
		}
	}
	calls := d.calls()
	renewed := 0
	for _, size := range calls {
		if size > 4096 {
			t.Errorf("a batch of %d grants: batches are bounded", size)
		}
		renewed += size
	}
	// 4s at TTL/3 = 1s is 4 periods; 6000 leases need 2 calls of at most
	// 4096 per period.
	if periods := 4; renewed < periods*n || renewed > (periods+1)*n || len(calls) > (periods+1)*2 {
		t.Fatalf("%d batch calls renewing %d grants in %d periods (sizes %v); want about %d calls renewing each of %d leases once per period",
			len(calls), renewed, periods, calls, periods*2, n)
	}
}

// TestScheduleEndsEachLeaseOnTime checks that one schedule serves leases
// of very different deadlines: a short lease granted after a long one (the
// schedule's timer is set for the long one's renewal) still ends the
// moment its own validity runs out, and the long one is renewed on time.
func TestScheduleEndsEachLeaseOnTime(t *testing.T) {
	clk := clock.NewFake(time.Unix(1000, 0))
	d := &batchSizes{Driver: mem.New(&mem.Options{Clock: clk})}
	c := fenced.NewClient(d, &fenced.Options{Clock: clk})
	defer c.Close()
	ctx := context.Background()
	long, err := c.TryAcquire(ctx, "long", &fenced.LeaseOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	settle() // the schedule's timer is set for the long lease's renewal
	short, err := c.TryAcquire(ctx, "short", &fenced.LeaseOptions{TTL: time.Second, ManualRenew: true})
	if err != nil {
		t.Fatal(err)
	}
	end := rootaccess.ValidUntil(short)
	for clk.Now().Before(end) {
		if short.Err() != nil {
			t.Fatalf("the short lease ended %v before its validity ran out: %v", end.Sub(clk.Now()), short.Err())
		}
		clk.Advance(10 * time.Millisecond)
		settle()
	}
	if !errors.Is(short.Err(), fenced.ErrExpired) {
		t.Fatalf("the short lease at %v past its validity: %v, want ErrExpired", clk.Now().Sub(end), short.Err())
	}
	// The long lease renews at a third of its TTL, 20s after its grant.
	advance(clk, 20*time.Second, 500*time.Millisecond)
	if long.Err() != nil {
		t.Fatal(long.Err())
	}
	if got := rootaccess.ValidUntil(long); !got.After(end.Add(time.Minute - time.Second)) {
		t.Fatalf("the long lease was not renewed by its third of the TTL: valid until %v", got)
	}
}
