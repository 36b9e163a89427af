package metrics

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
)

func TestClassification(t *testing.T) {
	held := fmt.Errorf("fenced: acquire %q: %w", "k", fenced.ErrHeld)
	for _, tc := range []struct {
		e    fenced.AcquireEvent
		want string
	}{
		{fenced.AcquireEvent{}, ResultAcquired},
		{fenced.AcquireEvent{FailedOpen: true}, ResultFailedOpen},
		{fenced.AcquireEvent{Err: held, MaxWait: fenced.NoWait}, ResultHeld},
		{fenced.AcquireEvent{Err: held}, ResultHeld}, // options refused before a wait was resolved
		{fenced.AcquireEvent{Err: held, MaxWait: time.Second}, ResultTimeout},
		{fenced.AcquireEvent{Err: held, MaxWait: fenced.WaitForever}, ResultTimeout},
		{fenced.AcquireEvent{Err: context.DeadlineExceeded, MaxWait: fenced.WaitForever}, ResultTimeout},
		{fenced.AcquireEvent{Err: context.Canceled, MaxWait: time.Second}, ResultCanceled},
		{fenced.AcquireEvent{Err: fenced.ErrUnavailable}, ResultError},
		{fenced.AcquireEvent{Err: fenced.ErrNoFence}, ResultError},
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
	hook := func(name string) fenced.Hooks {
		return fenced.Hooks{Lost: func(fenced.LostEvent) { got = append(got, name) }}
	}
	j := Join(hook("a"), fenced.Hooks{}, hook("b"))
	j.Lost(fenced.LostEvent{})
	if fmt.Sprint(got) != "[a b]" || j.Acquired != nil {
		t.Fatalf("joined hooks called %v; Acquired set: %v", got, j.Acquired != nil)
	}
}
