package fenced_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/clock"
	"github.com/fenced-dev/fenced/mem"
)

// TestDoKeepsTheLeaseForMinHold: a job shorter than MinHold keeps its key
// until MinHold has passed since the grant, so a duplicate started a little
// later on another client finds it held; Do returns only then, and the key
// is free afterwards.
func TestDoKeepsTheLeaseForMinHold(t *testing.T) {
	ctx := context.Background()
	store := mem.NewStore(clock.Real())
	a := fenced.NewClient(store.Driver(), nil)
	defer a.Close()
	b := fenced.NewClient(store.Driver(), nil)
	defer b.Close()

	const minHold = 400 * time.Millisecond
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		done <- a.Do(ctx, "cron:tick", &fenced.LeaseOptions{TTL: 5 * time.Second, MinHold: minHold},
			func(context.Context, *fenced.Lease) error { return nil })
	}()
	time.Sleep(minHold / 2)
	if _, err := b.TryAcquire(ctx, "cron:tick", nil); !errors.Is(err, fenced.ErrHeld) {
		t.Fatalf("duplicate during MinHold: err %v, want ErrHeld", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < minHold {
		t.Fatalf("Do returned after %v, before MinHold %v", took, minHold)
	}
	l, err := b.TryAcquire(ctx, "cron:tick", nil)
	if err != nil {
		t.Fatalf("after MinHold: %v", err)
	}
	l.Release(ctx)
}

// TestDoMinHoldEndsWithTheContext: a cancelled context cuts the hold short
// (a shutting-down worker does not linger) and the key is released.
func TestDoMinHoldEndsWithTheContext(t *testing.T) {
	store := mem.NewStore(clock.Real())
	c := fenced.NewClient(store.Driver(), nil)
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	start := time.Now()
	err := c.Do(ctx, "k", &fenced.LeaseOptions{TTL: 5 * time.Second, MinHold: time.Minute},
		func(context.Context, *fenced.Lease) error { cancel(); return nil })
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("Do held %v after its context ended", took)
	}
	l, err := c.TryAcquire(context.Background(), "k", nil)
	if err != nil {
		t.Fatalf("key not released: %v", err)
	}
	l.Release(context.Background())
}

// TestResolveMinHold: MinHold is kept by Resolve and refused when
// negative, above MaxHold, or beyond the validity without renewal.
func TestResolveMinHold(t *testing.T) {
	c := fenced.NewClient(mem.New(nil), nil)
	defer c.Close()
	s, err := c.Resolve(&fenced.LeaseOptions{MinHold: time.Second})
	if err != nil || s.MinHold != time.Second {
		t.Fatalf("resolved MinHold: %v, %v; want 1s", s.MinHold, err)
	}
	for _, o := range []fenced.LeaseOptions{
		{MinHold: -time.Second},
		{MinHold: 5 * time.Second, MaxHold: 2 * time.Second},
		{TTL: 2 * time.Second, MinHold: 3 * time.Second, ManualRenew: true},
	} {
		if _, err := c.Resolve(&o); !errors.Is(err, fenced.ErrInvalidOptions) || !errors.Is(err, fenced.ErrInvalidTTL) {
			t.Errorf("Resolve(%+v): %v, want ErrInvalidOptions and fenced.ErrInvalidTTL", o, err)
		}
	}
}
