// Package errclass applies the error rules every backend shares to the
// sentinel a backend names for an error of its client library.
package errclass

import (
	"context"
	"errors"
	"fmt"

	"github.com/fenced-dev/fenced"
)

// Func is a backend's error-classification hook: it names the sentinel
// an error of its client library matches, and knows nothing else. It
// returns:
//
//   - fenced.ErrUnavailable (or an error wrapping it, with detail) when the request
//     cannot have been applied: no connection, or refused before it ran
//     (throttled, busy, shutting down);
//   - fenced.ErrUnknownOutcome when it may have been applied: the connection failed
//     after the request was sent;
//   - fenced.ErrClosed when the client library was closed;
//   - nil for any other error, which is then reported as it is (a server's
//     own refusal of a malformed request, say).
//
// The rules every backend shares are in Wrap.
type Func func(err error) error

// Wrap wraps err with the sentinel classify names, by the rules every
// driver follows:
//
//   - A refusal (an error matching fenced.ErrHeld, fenced.ErrNotHeld or fenced.ErrNotFound) is
//     returned as it is: it is an answer, not a failure.
//   - A cancelled or expired context that classify names no sentinel for
//     matches fenced.ErrUnknownOutcome: the request may have been sent.
//   - A request that cannot change anything (mayApply false: a read) has
//     no unknown outcome: fenced.ErrUnknownOutcome becomes fenced.ErrUnavailable.
//
// The result is "sentinel: err" (both wrapped, so errors.Is finds the
// cause too), or err itself when no sentinel applies. classify may be nil
// (no error of the library is recognised).
func Wrap(err error, mayApply bool, classify Func) error {
	if err == nil || IsRefusal(err) {
		return err
	}
	var sentinel error
	if classify != nil {
		sentinel = classify(err)
	}
	if sentinel == nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		sentinel = fenced.ErrUnknownOutcome
	}
	if sentinel == nil {
		return err
	}
	if !mayApply && errors.Is(sentinel, fenced.ErrUnknownOutcome) {
		sentinel = fenced.ErrUnavailable
	}
	return fmt.Errorf("%w: %w", sentinel, err)
}

// IsRefusal reports whether err is the authority's answer that the
// request was refused (fenced.ErrHeld, fenced.ErrNotHeld, fenced.ErrNotFound) rather than a
// failure to get an answer.
func IsRefusal(err error) bool {
	return errors.Is(err, fenced.ErrHeld) || errors.Is(err, fenced.ErrNotHeld) || errors.Is(err, fenced.ErrNotFound)
}
