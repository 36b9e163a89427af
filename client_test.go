package fenced_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/clock"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/core/rootaccess"
	"github.com/fenced-dev/fenced/mem"
)

// faulty wraps the mem reference authority and injects faults: failed or
// unknown-outcome requests and weaker declared guarantees. It does not fake
// the authority's answers; mem decides every grant.
type faulty struct {
	*mem.Driver
	mu             sync.Mutex
	acquireErr     error // returned instead of calling mem
	acquireUnknown int   // this many TryAcquires reach mem, then report ErrUnknownOutcome
	renewErr       error
	fence          *fenced.FenceStrength
	renewCalls     atomic.Int32
	batchCalls     atomic.Int32
}

func (f *faulty) TryAcquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	f.mu.Lock()
	err, unknown := f.acquireErr, f.acquireUnknown > 0
	if unknown {
		f.acquireUnknown--
	}
	f.mu.Unlock()
	if err != nil {
		return 0, err
	}
	fence, err := f.Driver.TryAcquire(ctx, key, owner, ttl)
	if unknown && err == nil {
		return 0, fenced.ErrUnknownOutcome
	}
	return fence, err
}

func (f *faulty) Renew(ctx context.Context, g driver.Grant) error {
	f.renewCalls.Add(1)
	f.mu.Lock()
	err := f.renewErr
	f.mu.Unlock()
	if err != nil {
		return err
	}
	return f.Driver.Renew(ctx, g)
}

func (f *faulty) Capabilities() driver.Capabilities {
	g := f.Driver.Capabilities()
	if f.fence != nil {
		g.Fence = *f.fence
		g.Note = "injected"
	}
	return g
}

func (f *faulty) set(fn func(f *faulty)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

// batching adds driver.BatchRenewer to faulty.
type batching struct{ *faulty }

// Capabilities declares the batches, which mem leaves off by default.
func (b batching) Capabilities() driver.Capabilities {
	c := b.faulty.Capabilities()
	c.BatchRenew = true
	return c
}

func (b batching) RenewBatch(ctx context.Context, grants []driver.Grant) ([]error, error) {
	b.batchCalls.Add(1)
	errs := make([]error, len(grants))
	for i, g := range grants {
		errs[i] = b.Driver.Renew(ctx, g)
	}
	return errs, nil
}

func newFaulty(clk clock.Clock) *faulty {
	return &faulty{Driver: mem.New(&mem.Options{Clock: clk})}
}

// settle lets goroutines woken by a fake-clock advance run.
func settle() { time.Sleep(20 * time.Millisecond) }

// advance moves clk forward in small steps so timers fire in order.
func advance(clk *clock.Fake, d, step time.Duration) {
	for moved := time.Duration(0); moved < d; moved += step {
		clk.Advance(step)
		settle()
	}
}

func TestFailedRenewalEndsLeaseByLocalValidity(t *testing.T) {
	clk := clock.NewFake(time.Unix(1000, 0))
	f := newFaulty(clk)
	c := fenced.NewClient(f, &fenced.Options{Clock: clk})
	defer c.Close()
	ctx := context.Background()
	l, err := c.TryAcquire(ctx, "k", &fenced.LeaseOptions{TTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	validUntil := rootaccess.ValidUntil(l)
	if want := clk.Now().Add(3*time.Second - 3*time.Second/100 - 2*time.Millisecond); !validUntil.Equal(want) {
		t.Fatalf("ValidUntil = %v, want TTL minus margin from the send: %v", validUntil, want)
	}
	advance(clk, 1500*time.Millisecond, 100*time.Millisecond)
	if l.Err() != nil || f.renewCalls.Load() == 0 {
		t.Fatalf("after 1.5s: err %v, %d renewals; want held and renewed", l.Err(), f.renewCalls.Load())
	}
	// The authority becomes unreachable: renewals fail.
	f.set(func(f *faulty) { f.renewErr = fenced.ErrUnavailable })
	failedFrom := clk.Now()
	deadline := rootaccess.ValidUntil(l)
	for clk.Now().Before(deadline.Add(-100 * time.Millisecond)) {
		clk.Advance(100 * time.Millisecond)
		settle()
		if l.Err() != nil {
			t.Fatalf("lease ended at +%v, before its local validity (%v) ran out: %v", clk.Now().Sub(failedFrom), deadline.Sub(failedFrom), l.Err())
		}
	}
	if l.Healthy() {
		t.Fatal("Healthy() is true after failed renewals")
	}
	advance(clk, 200*time.Millisecond, 100*time.Millisecond)
	if !errors.Is(l.Err(), fenced.ErrExpired) {
		t.Fatalf("after local validity: %v, want ErrExpired", l.Err())
	}
	if f.renewCalls.Load() < 3 {
		t.Fatalf("only %d renewal attempts; failed renewals should be retried", f.renewCalls.Load())
	}
}

func TestRefusedRenewalLosesLeaseAtOnce(t *testing.T) {
	clk := clock.NewFake(time.Unix(1000, 0))
	f := newFaulty(clk)
	var lost atomic.Int32
	c := fenced.NewClient(f, &fenced.Options{Clock: clk, Hook: func(e fenced.Event) {
		if e.Kind == fenced.EventLost {
			if errors.Is(e.Err, fenced.ErrLost) {
				lost.Add(1)
			}
		}
	}})
	defer c.Close()
	ctx := context.Background()
	l, err := c.TryAcquire(ctx, "k", &fenced.LeaseOptions{TTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Break(ctx, "k", "test", "me"); err != nil {
		t.Fatal(err)
	}
	advance(clk, 1100*time.Millisecond, 100*time.Millisecond)
	if !errors.Is(l.Err(), fenced.ErrLost) {
		t.Fatalf("after a refused renewal: %v, want ErrLost", l.Err())
	}
	if lost.Load() != 1 {
		t.Fatalf("Lost hook called %d times, want 1", lost.Load())
	}
	if err := l.Renew(ctx); !errors.Is(err, fenced.ErrLost) {
		t.Fatalf("Renew of a lost lease: %v", err)
	}
}

func TestMaxHoldStopsRenewal(t *testing.T) {
	clk := clock.NewFake(time.Unix(1000, 0))
	f := newFaulty(clk)
	c := fenced.NewClient(f, &fenced.Options{Clock: clk})
	defer c.Close()
	l, err := c.TryAcquire(context.Background(), "k", &fenced.LeaseOptions{TTL: 3 * time.Second, MaxHold: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	start := clk.Now()
	for l.Err() == nil && clk.Now().Sub(start) < 10*time.Second {
		clk.Advance(100 * time.Millisecond)
		settle()
	}
	if held := clk.Now().Sub(start); !errors.Is(l.Err(), fenced.ErrExpired) || held > 5*time.Second {
		t.Fatalf("lease ended after %v with %v; want ErrExpired within MaxHold 5s", held, l.Err())
	}
}

func TestFailOpenOnlyWithoutFence(t *testing.T) {
	f := newFaulty(nil)
	f.acquireErr = fenced.ErrUnavailable
	var events []fenced.Event
	c := fenced.NewClient(f, &fenced.Options{Hook: func(e fenced.Event) {
		if e.Kind == fenced.EventAcquire {
			events = append(events, e)
		}
	}})
	defer c.Close()
	ctx := context.Background()
	if _, err := c.TryAcquire(ctx, "k", nil); !errors.Is(err, fenced.ErrUnavailable) {
		t.Fatalf("strict lease with the store down: %v, want ErrUnavailable (fail closed)", err)
	}
	if _, err := c.TryAcquire(ctx, "k", &fenced.LeaseOptions{MinFence: fenced.FenceNone}); !errors.Is(err, fenced.ErrUnavailable) {
		t.Fatalf("fenceless lease without FailOpen: %v, want ErrUnavailable", err)
	}
	l, err := c.TryAcquire(ctx, "k", &fenced.LeaseOptions{MinFence: fenced.FenceNone, FailOpen: true})
	if err != nil {
		t.Fatal(err)
	}
	if !l.FailedOpen() || l.Fence() != 0 || l.Err() != nil || !l.Options().ManualRenew {
		t.Fatalf("failed-open lease: FailedOpen %v fence %d err %v spec %+v", l.FailedOpen(), l.Fence(), l.Err(), l.Options())
	}
	if last := events[len(events)-1]; last.Lease == nil || !last.Lease.FailedOpen() {
		t.Fatalf("Acquired hook did not report the fail-open: %+v", last)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestMinFenceRefusesWeakerBackend(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		strength fenced.FenceStrength
		opts     fenced.LeaseOptions
		ok       bool
	}{
		{fenced.FenceStrict, fenced.LeaseOptions{}, true},
		{fenced.FenceStrict, fenced.LeaseOptions{MinFence: fenced.FenceNone}, true},
		{fenced.FenceRepeatable, fenced.LeaseOptions{}, false},
		{fenced.FenceRepeatable, fenced.LeaseOptions{MinFence: fenced.FenceStrict}, false},
		{fenced.FenceRepeatable, fenced.LeaseOptions{MinFence: fenced.FenceRepeatable}, true},
		{fenced.FenceRepeatable, fenced.LeaseOptions{MinFence: fenced.FenceNone}, true},
		{fenced.FenceNone, fenced.LeaseOptions{}, false},
		{fenced.FenceNone, fenced.LeaseOptions{MinFence: fenced.FenceRepeatable}, false},
		{fenced.FenceNone, fenced.LeaseOptions{MinFence: fenced.FenceNone}, true},
		{0, fenced.LeaseOptions{MinFence: fenced.FenceRepeatable}, false}, // undeclared counts as none
		{0, fenced.LeaseOptions{MinFence: fenced.FenceNone}, true},
	} {
		f := newFaulty(nil)
		s := tc.strength
		f.fence = &s
		c := fenced.NewClient(f, nil)
		l, err := c.TryAcquire(ctx, "k", &tc.opts)
		if tc.ok != (err == nil) {
			t.Errorf("fence %v, opts %+v: err %v", tc.strength, tc.opts, err)
		}
		if !tc.ok && !errors.Is(err, fenced.ErrNoFence) {
			t.Errorf("fence %v: %v, want ErrNoFence", tc.strength, err)
		}
		if l != nil {
			l.Release(ctx)
		}
		c.Close()
	}
}

func TestUnknownOutcomeIsResolvedBySameOwner(t *testing.T) {
	f := newFaulty(nil)
	f.acquireUnknown = 1 // the grant is applied but the answer is lost
	c := fenced.NewClient(f, nil)
	defer c.Close()
	ctx := context.Background()
	l, err := c.TryAcquire(ctx, "k", nil)
	if err != nil {
		t.Fatalf("retry after an unknown outcome: %v", err)
	}
	if l.Fence() != 1 {
		t.Fatalf("fence %d: the retry must find its own grant (fence 1), not take a second", l.Fence())
	}
	l.Release(ctx)
}

func TestBatchedRenewal(t *testing.T) {
	clk := clock.NewFake(time.Unix(1000, 0))
	f := newFaulty(clk)
	c := fenced.NewClient(batching{f}, &fenced.Options{Clock: clk})
	defer c.Close()
	ctx := context.Background()
	const n = 20
	var leases []*fenced.Lease
	for i := 0; i < n; i++ {
		l, err := c.TryAcquire(ctx, "batch:"+string(rune('a'+i)), &fenced.LeaseOptions{TTL: 3 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
		clk.Advance(20 * time.Millisecond) // acquired at different times
	}
	advance(clk, 6*time.Second, 100*time.Millisecond)
	for _, l := range leases {
		if l.Err() != nil {
			t.Fatalf("%s ended: %v", l.Key(), l.Err())
		}
	}
	// 6s at TTL/3 = 1s is about 6 periods: one batch each, not n renewals.
	if b, r := f.batchCalls.Load(), f.renewCalls.Load(); b > 8 || r != 0 {
		t.Fatalf("%d batches and %d single renewals for %d leases over 6 periods; want about 6 batches", b, r, n)
	}
}

func TestAcquireOptionsValidation(t *testing.T) {
	c := fenced.NewClient(mem.New(nil), nil)
	defer c.Close()
	ctx := context.Background()
	for _, o := range []fenced.LeaseOptions{
		{TTL: time.Second, SafetyMargin: 2 * time.Second},
		{TTL: time.Second, SafetyMargin: -time.Millisecond},
		{TTL: time.Second, MaxHold: -time.Second},
		{TTL: time.Second, RenewEvery: -time.Second},
		{TTL: time.Second, RenewEvery: 995 * time.Millisecond}, // after local validity ends
		{MaxWait: -time.Second},
		{FailOpen: true},
		{MinFence: fenced.FenceStrict, FailOpen: true},
		{MinFence: fenced.FenceStrength(9)},
	} {
		if _, err := c.TryAcquire(ctx, "k", &o); !errors.Is(err, fenced.ErrInvalidOptions) {
			t.Errorf("options %+v: %v, want ErrInvalidOptions", o, err)
		}
	}
	if l, _ := c.List(ctx, ""); len(l) != 0 {
		t.Fatalf("rejected options left leases: %+v", l)
	}
}

func TestOpenNamesTheMissingBackend(t *testing.T) {
	// This test binary links only mem and sqlite.
	_, err := fenced.Open(context.Background(), "postgres://u:secret@127.0.0.1:1/db", nil)
	if !errors.Is(err, fenced.ErrInvalidURL) || !strings.Contains(err.Error(), "packages under github.com/fenced-dev/fenced/") || !strings.Contains(err.Error(), "registered: mem, sqlite") || strings.Contains(err.Error(), "secret") {
		t.Fatalf("Open of an unlinked scheme: %v; want fenced.ErrInvalidURL naming where the backend packages are and what is registered, without the password", err)
	}
	_, err = fenced.Open(context.Background(), "nosuch://x", nil)
	if !errors.Is(err, fenced.ErrInvalidURL) || !strings.Contains(err.Error(), "unknown scheme") {
		t.Fatalf("Open of an unknown scheme: %v", err)
	}
}
