package fenced_test

import (
	"context"
	"errors"
	"github.com/fenced-dev/fenced/internal/core/ttlrule"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/clock"
)

// TestExplicitLeaseChoiceBeatsClientDefault is the regression test for
// issue 9 item 6, on today's options: a lease that says "strict fence" on
// a client whose Options.MinFence accepts no fence gets a strict fence;
// and a lease's zero values (no wait, renew, no cap, no fail-open) are
// what it gets, whatever the client is for.
func TestExplicitLeaseChoiceBeatsClientDefault(t *testing.T) {
	clk := clock.NewFake(time.Unix(1000, 0))
	f := newFaulty(clk)
	c := fenced.NewClient(f, &fenced.Options{Clock: clk, MinFence: fenced.FenceNone})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	strict := &fenced.LeaseOptions{TTL: 3 * time.Second, MinFence: fenced.FenceStrict}
	want := fenced.LeaseOptions{
		TTL:          3 * time.Second,
		MaxWait:      0,
		MinFence:     fenced.FenceStrict,
		FailOpen:     false,
		ManualRenew:  false,
		RenewEvery:   time.Second,
		MaxHold:      math.MaxInt64, // a zero MaxHold: no cap
		SafetyMargin: 3*time.Second/100 + 2*time.Millisecond,
	}
	if got, err := c.Resolve(strict); err != nil || got != want {
		t.Fatalf("Resolve = %+v, %v; want %+v", got, err, want)
	}

	// The store is down: the strict lease fails closed, and so does a
	// fenceless lease that did not ask to fail open.
	f.set(func(f *faulty) { f.acquireErr = fenced.ErrUnavailable })
	if l, err := c.Acquire(ctx, "ledger", strict); !errors.Is(err, fenced.ErrUnavailable) {
		t.Fatalf("strict lease with the store down: lease %v, err %v; want ErrUnavailable (fail closed)", l, err)
	}
	if l, err := c.TryAcquire(ctx, "cache", nil); !errors.Is(err, fenced.ErrUnavailable) {
		t.Fatalf("a lease without FailOpen on a fenceless client: lease %v, err %v; want ErrUnavailable", l, err)
	}
	f.set(func(f *faulty) { f.acquireErr = nil })

	// The key is held: the zero MaxWait fails at once.
	other := fenced.NewClient(f, &fenced.Options{Clock: clk})
	defer other.Close()
	holder, err := other.TryAcquire(ctx, "ledger", &fenced.LeaseOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire(ctx, "ledger", strict); !errors.Is(err, fenced.ErrHeld) {
		t.Fatalf("zero MaxWait on a held key: %v; want ErrHeld at once", err)
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// Granted: renewed, and kept past any cap since MaxHold is zero.
	l, err := c.Acquire(ctx, "ledger", strict)
	if err != nil {
		t.Fatal(err)
	}
	if l.Options() != want {
		t.Fatalf("lease options %+v, want %+v", l.Options(), want)
	}
	advance(clk, 8*time.Second, 100*time.Millisecond)
	if l.Err() != nil || f.renewCalls.Load() == 0 {
		t.Fatalf("after 8s (TTL 3s): err %v, %d renewals; want held and renewed", l.Err(), f.renewCalls.Load())
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestClientMinFenceAppliesWhenLeaseIsSilent checks the other half: a
// lease that leaves MinFence unset gets Options.MinFence, may then fail
// open if it asks to, and a combination that cannot be honoured is an
// error naming the field and where its value came from.
func TestClientMinFenceAppliesWhenLeaseIsSilent(t *testing.T) {
	f := newFaulty(nil)
	c := fenced.NewClient(f, &fenced.Options{MinFence: fenced.FenceNone})
	defer c.Close()
	cache := &fenced.LeaseOptions{FailOpen: true, MaxWait: time.Minute, ManualRenew: true, MaxHold: 5 * time.Second}
	got, err := c.Resolve(cache)
	want := fenced.LeaseOptions{
		TTL:          ttlrule.Default,
		MaxWait:      time.Minute,
		MinFence:     fenced.FenceNone,
		FailOpen:     true,
		ManualRenew:  true,
		MaxHold:      5 * time.Second,
		SafetyMargin: ttlrule.Default/100 + 2*time.Millisecond,
	}
	if err != nil || got != want {
		t.Fatalf("Resolve = %+v, %v; want %+v", got, err, want)
	}
	f.set(func(f *faulty) { f.acquireErr = fenced.ErrUnavailable })
	l, err := c.TryAcquire(context.Background(), "cache", cache)
	if err != nil || !l.FailedOpen() {
		t.Fatalf("fail-open lease on a fenceless client with the store down: %v, %v; want a failed-open lease", l, err)
	}
	l.Release(context.Background())

	for _, tc := range []struct {
		client fenced.FenceStrength
		lease  fenced.LeaseOptions
		want   string
	}{
		// Failing open never lowers the fence: with the package default...
		{0, fenced.LeaseOptions{FailOpen: true}, "MinFence is strict (package default)"},
		// ... or the client's.
		{fenced.FenceRepeatable, fenced.LeaseOptions{FailOpen: true}, "MinFence is repeatable-after-failover (client default, Options.MinFence)"},
		// A margin that does not fit the TTL is not silently shrunk.
		{fenced.FenceNone, fenced.LeaseOptions{SafetyMargin: time.Second, TTL: 500 * time.Millisecond}, "SafetyMargin"},
		{fenced.FenceNone, fenced.LeaseOptions{TTL: time.Second, RenewEvery: 2 * time.Second}, "RenewEvery"},
		{fenced.FenceNone, fenced.LeaseOptions{MaxWait: -time.Second}, "MaxWait"},
		{fenced.FenceStrength(9), fenced.LeaseOptions{}, "MinFence (client default, Options.MinFence)"},
	} {
		c := fenced.NewClient(newFaulty(nil), &fenced.Options{MinFence: tc.client})
		_, err := c.TryAcquire(context.Background(), "k", &tc.lease)
		if !errors.Is(err, fenced.ErrInvalidOptions) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("client MinFence %v, lease %+v: %v; want ErrInvalidOptions naming %q", tc.client, tc.lease, err, tc.want)
		}
		c.Close()
	}
}

// TestFenceStrengthNames checks the names of the strengths the root
// declares, which package driver's String gives by value.
func TestFenceStrengthNames(t *testing.T) {
	for s, want := range map[fenced.FenceStrength]string{
		0: "unset", fenced.FenceNone: "none", fenced.FenceRepeatable: "repeatable-after-failover",
		fenced.FenceStrict: "strict", fenced.FenceStrict + 1: "FenceStrength(4)",
	} {
		if got := s.String(); got != want {
			t.Errorf("FenceStrength(%d).String() = %q, want %q", int(s), got, want)
		}
	}
}
