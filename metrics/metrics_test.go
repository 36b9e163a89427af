package metrics

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/mem"
)

// downDriver is a store that is unavailable for acquisitions.
type downDriver struct{ driver.Driver }

func (downDriver) TryAcquire(context.Context, string, string, time.Duration) (uint64, error) {
	return 0, fenced.ErrUnavailable
}

// failedOpen returns a real lease granted locally with the store down.
func failedOpen(t *testing.T) *fenced.Lease {
	c := fenced.NewClient(downDriver{mem.New(nil)}, nil)
	t.Cleanup(func() { c.Close() })
	l, err := c.TryAcquire(context.Background(), "k", &fenced.LeaseOptions{MinFence: fenced.FenceNone, FailOpen: true})
	if err != nil || !l.FailedOpen() {
		t.Fatalf("fail-open lease: %v (failed open: %v)", err, err == nil && l.FailedOpen())
	}
	return l
}

func TestClassification(t *testing.T) {
	held := fmt.Errorf("fenced: acquire %q: %w", "k", fenced.ErrHeld)
	for _, tc := range []struct {
		e    fenced.Event
		want string
	}{
		{fenced.Event{}, ResultAcquired},
		{fenced.Event{Lease: failedOpen(t)}, ResultFailedOpen},
		{fenced.Event{Err: held, MaxWait: 0}, ResultHeld},
		{fenced.Event{Err: held}, ResultHeld}, // options refused before a wait was resolved
		{fenced.Event{Err: held, MaxWait: time.Second}, ResultTimeout},
		{fenced.Event{Err: held, MaxWait: fenced.WaitForever}, ResultTimeout},
		{fenced.Event{Err: context.DeadlineExceeded, MaxWait: fenced.WaitForever}, ResultTimeout},
		{fenced.Event{Err: context.Canceled, MaxWait: time.Second}, ResultCanceled},
		{fenced.Event{Err: fenced.ErrUnavailable}, ResultError},
		{fenced.Event{Err: fenced.ErrNoFence}, ResultError},
	} {
		if got := AcquireResult(tc.e); got != tc.want {
			t.Errorf("AcquireResult(%+v) = %q, want %q", tc.e, got, tc.want)
		}
	}
	for err, want := range map[error]string{
		nil: RenewOK, fmt.Errorf("x: %w", fenced.ErrNotHeld): RenewRefused,
		fenced.ErrUnavailable: RenewError, fenced.ErrUnknownOutcome: RenewError,
	} {
		if got := RenewResult(err); got != want {
			t.Errorf("RenewResult(%v) = %q, want %q", err, got, want)
		}
	}
	for err, want := range map[error]string{
		fmt.Errorf("%w: %w (alice): why", fenced.ErrLost, fenced.ErrBroken): LostBroken,
		fmt.Errorf("%w: refused", fenced.ErrLost):                           LostRefused,
		fmt.Errorf("%w: no renewal", fenced.ErrExpired):                     LostExpired,
		fenced.ErrClosed:            LostClosed,
		errors.New("anything else"): LostRefused,
	} {
		if got := LostReason(err); got != want {
			t.Errorf("LostReason(%v) = %q, want %q", err, got, want)
		}
	}
	for key, want := range map[string]string{"invoice:inv_72": "invoice", "a:b:c": "a", "nightly": "nightly", ":x": ""} {
		if got := DefaultKeyGroup(key); got != want {
			t.Errorf("DefaultKeyGroup(%q) = %q, want %q", key, got, want)
		}
	}
}

func TestJoinCallsEachInOrder(t *testing.T) {
	var got []string
	hook := func(name string) func(fenced.Event) {
		return func(e fenced.Event) { got = append(got, name+":"+fmt.Sprint(e.Kind)) }
	}
	j := Join(hook("a"), nil, hook("b"))
	j(fenced.Event{Kind: fenced.EventLost})
	if fmt.Sprint(got) != "[a:lost b:lost]" {
		t.Fatalf("joined hooks called %v", got)
	}
	if Join(nil, nil) != nil {
		t.Fatal("Join of no hooks is not nil")
	}
}
