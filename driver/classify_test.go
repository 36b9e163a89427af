package driver

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

func TestClassify(t *testing.T) {
	errConn := errors.New("connection reset")
	errBusy := errors.New("server busy")
	errSyntax := errors.New("syntax error")
	hook := func(err error) error {
		switch {
		case errors.Is(err, errConn):
			return ErrUnknownOutcome
		case errors.Is(err, errBusy):
			return fmt.Errorf("busy: %w", ErrUnavailable)
		}
		return nil
	}
	refusal := fmt.Errorf("k: %w", ErrNotHeld)
	for _, c := range []struct {
		name     string
		err      error
		mayApply bool
		hook     Classifier
		want     error // the sentinel, or nil for err returned as it is
	}{
		{"write cut off", errConn, true, hook, ErrUnknownOutcome},
		{"read cut off applied nothing", errConn, false, hook, ErrUnavailable},
		{"refused before it ran", errBusy, true, hook, ErrUnavailable},
		{"unrecognised", errSyntax, true, hook, nil},
		{"refusal", refusal, true, func(error) error { return ErrUnavailable }, nil},
		{"context of a write", context.DeadlineExceeded, true, hook, ErrUnknownOutcome},
		{"context of a read", context.Canceled, false, nil, ErrUnavailable},
	} {
		got := Classify(c.err, c.mayApply, c.hook)
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
		if other := map[error]error{ErrUnavailable: ErrUnknownOutcome, ErrUnknownOutcome: ErrUnavailable}[c.want]; errors.Is(got, other) {
			t.Errorf("%s: %v matches both %v and %v", c.name, got, c.want, other)
		}
	}
	if err := Classify(nil, true, hook); err != nil {
		t.Errorf("Classify(nil) = %v", err)
	}
}
