package fenced

import (
	"context"
	"errors"
	"fmt"

	"github.com/fenced-dev/fenced/driver"
)

// Sentinel errors that drivers return; see package driver for their
// meaning. Bad input (a key, a TTL, a URL) also matches ErrInvalidOptions or
// ErrInvalidKey, driver.ErrInvalidTTL and driver.ErrInvalidURL.
var (
	ErrHeld           = driver.ErrHeld
	ErrNotHeld        = driver.ErrNotHeld
	ErrLost           = driver.ErrLost
	ErrClosed         = driver.ErrClosed
	ErrUnavailable    = driver.ErrUnavailable
	ErrUnknownOutcome = driver.ErrUnknownOutcome
	ErrNotFound       = driver.ErrNotFound
	ErrUnsupported    = driver.ErrUnsupported
	ErrInvalidKey     = driver.ErrInvalidKey
)

// Sentinel errors of the portable layer and the resources it protects,
// which no driver returns.
var (
	// ErrExpired is the cause given to a lease's context when its local
	// validity ran out before a renewal was confirmed.
	ErrExpired = errors.New("lease validity expired locally")
	// ErrStaleFence means a protected resource refused a write because it
	// has already seen a newer fence for the key.
	ErrStaleFence = errors.New("stale fence: a newer holder exists")
	// ErrNoFence means a lease was requested on a backend whose fence is
	// weaker than the lease's minimum (LeaseOptions.MinFence).
	ErrNoFence = errors.New("backend cannot provide the fencing token this lease requires")
	// ErrInvalidOptions means lease options failed validation: a value out
	// of range or a combination that cannot be honoured (FailOpen with a
	// fence required). Errors about durations match driver.ErrInvalidTTL as well.
	ErrInvalidOptions = errors.New("invalid lease options")
)

// ErrBroken is part of the cause of a lease that an admin broke (Client.Break,
// fenced break, the break button of fenced serve). Such a cause also matches
// ErrLost, so IsLost stays true and code that only checks ErrLost keeps
// working; ErrBroken lets a holder, a log line or a metric say "broken by
// alice: host wedged" instead of "renewal refused".
//
// It is only reported where it can be told apart: when a renewal is refused
// and the store keeps an audit log of breaks (driver.BreakLogger: the SQL
// backends, Redis, Redlock, mem) that records a break of this very grant
// (same fence and owner). On etcd and ZooKeeper, which keep no break log, a
// broken lease is reported as lost (ErrLost) without ErrBroken.
var ErrBroken = errors.New("broken by an admin")

// ErrReleased is the cause of a lease context cancelled by Release.
var ErrReleased = errors.New("lease released")

// IsLost reports whether a lease ended without its holder ending it. That
// is ErrLost (the authority no longer had the grant: renewal refused,
// broken by an admin, session ended) or ErrExpired (local validity ran out
// before a renewal was confirmed). Another worker may hold the key now.
// Stop, and let the fence decide which writes already sent count.
//
// It is false for the endings the holder chose: ErrReleased (Release) and
// ErrClosed (Client.Close releases its leases). It is also false for
// ErrStaleFence. That is a resource refusing a write, not news about the
// lease, though it does mean a newer holder exists.
func IsLost(err error) bool {
	return errors.Is(err, ErrLost) || errors.Is(err, ErrExpired)
}

// HeldError is what TryAcquire's ErrHeld knows of the holder: its
// remaining time. See package driver.
type HeldError = driver.HeldError

// LeaseEndedError is returned by Client.Do when the lease ended before fn
// returned. It tells "the work finished, then the lease was lost" from "the
// lease was lost and the work did not finish":
//
//   - WorkErr nil: fn returned nil, so whatever it committed with the fence
//     stands (a fenced resource accepted it, so no newer holder had written
//     before it). The work is done; the loss is worth logging, not redoing
//     the work for.
//   - WorkErr non-nil: fn failed, typically because its context was
//     cancelled by the loss or a guarded write was refused as stale.
//     Nothing after the failure happened; retry under a new lease.
//
// It matches its Cause and its WorkErr with errors.Is and errors.As, so
// errors.Is(err, ErrLost) and IsLost(err) keep working.
type LeaseEndedError struct {
	// Fence identifies the grant that ended. Do's error names its key.
	Fence uint64
	// Cause is why the lease ended: an error matching ErrLost or
	// ErrExpired (IsLost), ErrClosed when the client was closed, or
	// ErrReleased when fn released the lease itself.
	Cause error
	// WorkErr is what fn returned.
	WorkErr error
}

// Error implements error.
func (e *LeaseEndedError) Error() string {
	if e.WorkErr == nil {
		return fmt.Sprintf("lease ended while the work ran, which returned no error: %v", e.Cause)
	}
	return fmt.Sprintf("lease ended while the work ran: %v; the work returned: %v", e.Cause, e.WorkErr)
}

// Unwrap returns Cause and, if set, WorkErr.
func (e *LeaseEndedError) Unwrap() []error {
	if e.WorkErr == nil {
		return []error{e.Cause}
	}
	return []error{e.Cause, e.WorkErr}
}

// ctxEnded is the error for a wait that ended with ctx: it matches
// ctx.Err() and, when ctx was cancelled with a cause, says and matches
// that cause too.
func ctxEnded(ctx context.Context) error {
	err, cause := ctx.Err(), context.Cause(ctx)
	if cause == nil || cause == err {
		return err
	}
	return endedError{err: err, cause: cause}
}

// endedError is a context's error together with the cause it was given.
type endedError struct{ err, cause error }

func (e endedError) Error() string { return e.cause.Error() }

func (e endedError) Unwrap() []error { return []error{e.cause, e.err} }

// expiry is the cause of a lease whose local validity ran out. Its message
// is made when asked for, not by the schedule, which may end thousands of
// leases at once.
type expiry struct {
	l       *Lease
	lastErr error
	maxHold bool
}

func (e *expiry) Error() string {
	switch s := e.l.spec; {
	case e.maxHold:
		return fmt.Sprintf("%v: MaxHold %v reached, renewal stopped", ErrExpired, s.MaxHold)
	case e.lastErr != nil:
		return fmt.Sprintf("%v: no renewal confirmed in time (last error: %v)", ErrExpired, e.lastErr)
	case s.ManualRenew:
		return fmt.Sprintf("%v: TTL %v ran out without renewal", ErrExpired, s.TTL)
	}
	return fmt.Sprintf("%v: no renewal confirmed in time", ErrExpired)
}

// Unwrap makes an expiry match ErrExpired.
func (e *expiry) Unwrap() error { return ErrExpired }

// invalid returns an error matching ErrInvalidOptions (and driver.ErrInvalidTTL
// for durations) about field.
func invalid(duration bool, field string, format string, args ...any) error {
	return &optionError{field: field, msg: fmt.Sprintf(format, args...), duration: duration}
}

// optionError is a refused lease option. Its text names the field alone,
// so a negative MaxWait never reads as an invalid TTL.
type optionError struct {
	field, msg string
	duration   bool // it also matches driver.ErrInvalidTTL
}

func (e *optionError) Error() string {
	return ErrInvalidOptions.Error() + ": " + e.field + ": " + e.msg
}

// Is matches ErrInvalidOptions, and driver.ErrInvalidTTL for a duration.
func (e *optionError) Is(target error) bool {
	return target == ErrInvalidOptions || e.duration && target == driver.ErrInvalidTTL
}
