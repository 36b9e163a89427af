package errclass

import (
	"context"
	"errors"
	"fmt"

	"testing"

	"github.com/fenced-dev/fenced"
)

func TestWrap(t *testing.T) {
	errConn := errors.New("connection reset")
	errBusy := errors.New("server busy")
	errSyntax := errors.New("syntax error")
	hook := func(err error) error {
		switch {
		case errors.Is(err, errConn):
			return fenced.ErrUnknownOutcome
		case errors.Is(err, errBusy):
			return fmt.Errorf("busy: %w", fenced.ErrUnavailable)
		}
		return nil
	}
	refusal := fmt.Errorf("k: %w", fenced.ErrNotHeld)
	for _, c := range []struct {
		name     string
		err      error
		mayApply bool
		hook     Func
		want     error // the sentinel, or nil for err returned as it is
	}{
		{"write cut off", errConn, true, hook, fenced.ErrUnknownOutcome},
		{"read cut off applied nothing", errConn, false, hook, fenced.ErrUnavailable},
		{"refused before it ran", errBusy, true, hook, fenced.ErrUnavailable},
		{"unrecognised", errSyntax, true, hook, nil},
		{"refusal", refusal, true, func(error) error { return fenced.ErrUnavailable }, nil},
		{"context of a write", context.DeadlineExceeded, true, hook, fenced.ErrUnknownOutcome},
		{"context of a read", context.Canceled, false, nil, fenced.ErrUnavailable},
	} {
		got := Wrap(c.err, c.mayApply, c.hook)
		if !errors.Is(got, c.err) {
			t.Errorf("%s: %v does not wrap its cause %v", c.name, got, c.err)
		}
		if c.want == nil {
			if got != c.err {
				t.Errorf("%s: %v, want %v as it is", c.name, got, c.err)
			}
			continue
		}
		if !errors.Is(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
		if other := map[error]error{fenced.ErrUnavailable: fenced.ErrUnknownOutcome, fenced.ErrUnknownOutcome: fenced.ErrUnavailable}[c.want]; errors.Is(got, other) {
			t.Errorf("%s: %v matches both %v and %v", c.name, got, c.want, other)
		}
	}
	if err := Wrap(nil, true, hook); err != nil {
		t.Errorf("Wrap(nil) = %v", err)
	}
}
