package fenced_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/clock"
	"github.com/fenced-dev/fenced/driver"
)

// cacheDefaults are client defaults made for cache work: any store, fail
// open, wait a minute, no renewal, a short hold, a slow renewal period.
var cacheDefaults = fenced.LeaseOptions{
	MinFence:   fenced.FenceNone,
	FailOpen:   fenced.On,
	MaxWait:    time.Minute,
	AutoRenew:  fenced.Off,
	MaxHold:    5 * time.Second,
	RenewEvery: 20 * time.Second,
}

// TestExplicitLeaseChoiceBeatsClientDefault is the regression test for
// issue 9 item 6: a lease that says "strict fence, do not wait, renew, no
// cap, do not fail open" on a client whose defaults say the opposite gets
// exactly what it said, not the defaults.
func TestExplicitLeaseChoiceBeatsClientDefault(t *testing.T) {
	clk := clock.NewFake(time.Unix(1000, 0))
	f := newFaulty(clk)
	c := fenced.NewClient(f, &fenced.Options{Clock: clk, Defaults: cacheDefaults})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	strict := &fenced.LeaseOptions{
		TTL:       3 * time.Second,
		MinFence:  fenced.FenceStrict,
		MaxWait:   fenced.NoWait,
		AutoRenew: fenced.On,
		MaxHold:   fenced.HoldForever,
	}
	want := fenced.LeaseSpec{
		TTL:          3 * time.Second,
		MaxWait:      fenced.NoWait,
		MinFence:     fenced.FenceStrict,
		FailOpen:     false,
		AutoRenew:    true,
		RenewEvery:   time.Second, // the default 20s does not fit the lease's 3s TTL
		MaxHold:      fenced.HoldForever,
		SafetyMargin: 3*time.Second/100 + 2*time.Millisecond,
	}
	if got, err := c.Resolve(strict); err != nil || got != want {
		t.Fatalf("Resolve = %+v, %v; want %+v", got, err, want)
	}

	// The store is down: the strict lease fails closed instead of running
	// without a lease as the client's fail-open default would.
	f.set(func(f *faulty) { f.acquireErr = driver.ErrUnavailable })
	if l, err := c.Acquire(ctx, "ledger", strict); !errors.Is(err, fenced.ErrUnavailable) {
		t.Fatalf("strict lease with the store down: lease %v, err %v; want ErrUnavailable (fail closed)", l, err)
	}
	// FailOpen Off turns the default off for a fenceless lease too.
	if l, err := c.TryAcquire(ctx, "cache", &fenced.LeaseOptions{FailOpen: fenced.Off}); !errors.Is(err, fenced.ErrUnavailable) {
		t.Fatalf("FailOpen Off over a fail-open default: lease %v, err %v; want ErrUnavailable", l, err)
	}
	f.set(func(f *faulty) { f.acquireErr = nil })

	// The key is held: NoWait fails at once instead of waiting the
	// client's minute (which, on the fake clock, would never pass).
	other := fenced.NewClient(f, &fenced.Options{Clock: clk})
	defer other.Close()
	holder, err := other.TryAcquire(ctx, "ledger", &fenced.LeaseOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire(ctx, "ledger", strict); !errors.Is(err, fenced.ErrHeld) {
		t.Fatalf("NoWait on a held key with a client default wait: %v; want ErrHeld at once", err)
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// Granted: renewed although the default says not to, and kept past the
	// default MaxHold because the lease said HoldForever.
	l, err := c.Acquire(ctx, "ledger", strict)
	if err != nil {
		t.Fatal(err)
	}
	if l.Spec() != want {
		t.Fatalf("lease spec %+v, want %+v", l.Spec(), want)
	}
	advance(clk, 8*time.Second, 100*time.Millisecond)
	if l.Err() != nil || f.renewCalls.Load() == 0 {
		t.Fatalf("after 8s (default MaxHold 5s, TTL 3s): err %v, %d renewals; want held and renewed", l.Err(), f.renewCalls.Load())
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestClientDefaultsApplyWhenLeaseIsSilent checks the other half: a lease
// that sets nothing gets the client's defaults, and contradictory defaults
// are errors naming Options.Defaults.
func TestClientDefaultsApplyWhenLeaseIsSilent(t *testing.T) {
	f := newFaulty(nil)
	c := fenced.NewClient(f, &fenced.Options{Defaults: cacheDefaults})
	defer c.Close()
	got, err := c.Resolve(nil)
	want := fenced.LeaseSpec{
		TTL:          fenced.DefaultTTL,
		MaxWait:      time.Minute,
		MinFence:     fenced.FenceNone,
		FailOpen:     true,
		AutoRenew:    false,
		MaxHold:      5 * time.Second,
		SafetyMargin: fenced.DefaultTTL/100 + 2*time.Millisecond,
	}
	if err != nil || got != want {
		t.Fatalf("Resolve(nil) = %+v, %v; want %+v", got, err, want)
	}
	f.set(func(f *faulty) { f.acquireErr = driver.ErrUnavailable })
	l, err := c.TryAcquire(context.Background(), "cache", nil)
	if err != nil || !l.FailedOpen() {
		t.Fatalf("silent lease with fail-open defaults and the store down: %v, %v; want a failed-open lease", l, err)
	}
	l.Release(context.Background())

	for _, tc := range []struct {
		defaults fenced.LeaseOptions
		lease    fenced.LeaseOptions
		want     string
	}{
		// Fail-open defaults without MinFence none: no lease can use them.
		{fenced.LeaseOptions{FailOpen: fenced.On}, fenced.LeaseOptions{}, "FailOpen (client default, Options.Defaults)"},
		// A lease asking to fail open never lowers the client's fence.
		{fenced.LeaseOptions{MinFence: fenced.FenceRepeatable}, fenced.LeaseOptions{FailOpen: fenced.On}, "MinFence is repeatable-after-failover (client default, Options.Defaults)"},
		// A default margin that does not fit the lease's TTL is not
		// silently shrunk.
		{fenced.LeaseOptions{SafetyMargin: time.Second}, fenced.LeaseOptions{TTL: 500 * time.Millisecond}, "SafetyMargin (client default, Options.Defaults)"},
		{fenced.LeaseOptions{TTL: time.Second, RenewEvery: 2 * time.Second}, fenced.LeaseOptions{}, "RenewEvery (client default, Options.Defaults)"},
		{fenced.LeaseOptions{MaxWait: -time.Second}, fenced.LeaseOptions{}, "MaxWait (client default, Options.Defaults)"},
	} {
		c := fenced.NewClient(newFaulty(nil), &fenced.Options{Defaults: tc.defaults})
		_, err := c.TryAcquire(context.Background(), "k", &tc.lease)
		if !errors.Is(err, fenced.ErrInvalidOptions) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("defaults %+v, lease %+v: %v; want ErrInvalidOptions naming %q", tc.defaults, tc.lease, err, tc.want)
		}
		c.Close()
	}
}

func TestParseFenceStrength(t *testing.T) {
	for in, want := range map[string]fenced.FenceStrength{
		"strict": fenced.FenceStrict, "Repeatable": fenced.FenceRepeatable,
		"repeatable-after-failover": fenced.FenceRepeatable, "none": fenced.FenceNone,
	} {
		if got, err := fenced.ParseFenceStrength(in); err != nil || got != want {
			t.Errorf("ParseFenceStrength(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "unset", "weak"} {
		if _, err := fenced.ParseFenceStrength(in); !errors.Is(err, fenced.ErrInvalidOptions) {
			t.Errorf("ParseFenceStrength(%q): %v, want ErrInvalidOptions", in, err)
		}
	}
}
