package fenced_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/mem"
)

// TestOptionErrorsNameTheirField checks that a refused duration names the
// field at fault, and only the TTL's refusal speaks of the TTL. Each still
// matches ErrInvalidOptions and fenced.ErrInvalidTTL.
func TestOptionErrorsNameTheirField(t *testing.T) {
	c := fenced.NewClient(mem.New(nil), nil)
	defer c.Close()
	for _, tc := range []struct {
		opts fenced.LeaseOptions
		want string
	}{
		{fenced.LeaseOptions{MaxWait: -time.Second}, "invalid lease options: MaxWait: -1s is negative"},
		{fenced.LeaseOptions{MaxHold: -time.Second}, "invalid lease options: MaxHold: -1s is negative"},
		{fenced.LeaseOptions{MinHold: -time.Second}, "invalid lease options: MinHold: -1s is negative"},
		{fenced.LeaseOptions{TTL: time.Nanosecond}, "invalid lease options: TTL: 1ns is outside ["},
	} {
		_, err := c.Resolve(&tc.opts)
		if !errors.Is(err, fenced.ErrInvalidOptions) || !errors.Is(err, fenced.ErrInvalidTTL) {
			t.Errorf("Resolve(%+v) = %v; want ErrInvalidOptions and fenced.ErrInvalidTTL", tc.opts, err)
			continue
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, tc.want) {
			t.Errorf("Resolve(%+v) = %q; want it to start %q", tc.opts, msg, tc.want)
		}
		if strings.Contains(msg, fenced.ErrInvalidTTL.Error()) {
			t.Errorf("Resolve(%+v) = %q: it says %q, which names no field or stutters", tc.opts, msg, fenced.ErrInvalidTTL)
		}
	}
	_, err := c.Resolve(&fenced.LeaseOptions{OwnerTag: "UPPER"})
	if !errors.Is(err, fenced.ErrInvalidOptions) || errors.Is(err, fenced.ErrInvalidTTL) {
		t.Errorf("Resolve with a bad OwnerTag = %v; want ErrInvalidOptions alone", err)
	}
}

// TestEventKindString checks that every kind prints its name and that a
// value naming no kind says so.
func TestEventKindString(t *testing.T) {
	for k, want := range map[fenced.EventKind]string{
		fenced.EventAttempt:    "attempt",
		fenced.EventAcquire:    "acquire",
		fenced.EventRenew:      "renew",
		fenced.EventLost:       "lost",
		fenced.EventRelease:    "release",
		fenced.EventStaleWrite: "stale-write",
		fenced.EventKind(0):    "EventKind(0)",
		fenced.EventKind(99):   "EventKind(99)",
	} {
		if got := k.String(); got != want {
			t.Errorf("EventKind(%d).String() = %q, want %q", int(k), got, want)
		}
	}
}

// TestNilArgumentsAreRefused checks that Do refuses a nil work function
// with an error, and with nothing acquired, instead of a panic.
func TestNilArgumentsAreRefused(t *testing.T) {
	c := fenced.NewClient(mem.New(nil), nil)
	defer c.Close()
	ctx := context.Background()
	err := c.Do(ctx, "k", nil, nil)
	if !errors.Is(err, fenced.ErrInvalidOptions) || !strings.Contains(err.Error(), "work function is nil") {
		t.Fatalf("Do with nil work = %v; want ErrInvalidOptions naming the nil work function", err)
	}
	l, err := c.TryAcquire(ctx, "k", nil)
	if err != nil {
		t.Fatalf("the refused Do left the key held: %v", err)
	}
	l.Release(ctx)
}
