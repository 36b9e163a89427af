package fenced_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/core/token"
	"github.com/fenced-dev/fenced/mem"
)

// bareDriver is a driver with the methods of driver.Driver only: every
// optional operation its store declares is missing.
type bareDriver struct{ driver.Driver }

// TestDoorsRefuseWhatTheStoreCannotDo checks that the Client's doors to
// optional operations say ErrUnsupported, and Capabilities says false,
// where the driver declares an operation without having its methods.
func TestDoorsRefuseWhatTheStoreCannotDo(t *testing.T) {
	ctx := context.Background()
	c := fenced.NewClient(bareDriver{mem.NewStore(nil).Driver()}, nil)
	defer c.Close()
	caps := c.Capabilities()
	if caps.Value || caps.Observe || caps.BreakLog || caps.FenceFloor || caps.Subscribe || caps.Queue {
		t.Fatalf("Capabilities of a driver without optional methods = %+v; want every flag off", caps)
	}
	l, err := c.TryAcquire(ctx, "doors", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	_, _, errValue := c.Value(ctx, "doors")
	_, errWatch := c.Watch(ctx, "doors")
	_, errBreaks := c.Breaks(ctx, "")
	_, _, errFloor := c.FenceFloor(ctx)
	_, errRaise := c.RaiseFenceFloor(ctx, 1)
	_, _, errPrune := c.Prune(ctx, time.Hour)
	for name, err := range map[string]error{
		"Value": errValue, "SetValue": l.SetValue(ctx, "v"), "Watch": errWatch, "Breaks": errBreaks,
		"FenceFloor": errFloor, "RaiseFenceFloor": errRaise, "Prune": errPrune,
	} {
		if !errors.Is(err, fenced.ErrUnsupported) {
			t.Errorf("%s on a store without it = %v; want ErrUnsupported", name, err)
		}
	}
	if err := l.Err(); err != nil {
		t.Fatalf("a refused SetValue ended the lease: %v", err)
	}
}

// TestDoorsValueAndWatch checks a value round trip (Lease.SetValue, then
// Client.Value with the owner shortened) and that Watch wakes on a
// release, on mem, which has both.
func TestDoorsValueAndWatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := fenced.NewClient(mem.NewStore(nil).Driver(), nil)
	defer c.Close()
	if caps := c.Capabilities(); !caps.Value || !caps.Observe {
		t.Fatalf("mem's Capabilities = %+v; want Value and Observe", caps)
	}
	if _, _, err := c.Value(ctx, "never"); !errors.Is(err, fenced.ErrNotFound) {
		t.Fatalf("Value of a key never granted = %v; want ErrNotFound", err)
	}
	l, err := c.TryAcquire(ctx, "leader", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.SetValue(ctx, "host-a"); err != nil {
		t.Fatal(err)
	}
	info, value, err := c.Value(ctx, "leader")
	if err != nil || !info.Held || info.Fence != l.Fence() || value != "host-a" {
		t.Fatalf("Value = %+v %q %v; want held at fence %d with host-a", info, value, err, l.Fence())
	}
	if info.Owner != token.Short(l.Owner()) || strings.Contains(info.Owner, l.Owner()) {
		t.Fatalf("Value's owner %q is not the holder's token shortened", info.Owner)
	}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	wake, err := c.Watch(wctx, "leader")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wake:
	case <-ctx.Done():
		t.Fatal("Watch did not wake on the release")
	}
	if err := l.SetValue(ctx, "late"); !errors.Is(err, fenced.ErrNotHeld) {
		t.Fatalf("SetValue after the release = %v; want ErrNotHeld", err)
	}
}
