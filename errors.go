package fenced

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fenced-dev/fenced/internal/core/sentinel"
)

// Sentinel errors that drivers return, wrapped with detail. They are the
// only sentinels a driver returns (package driver has none of its own).
var (
	// ErrHeld means the key is held by another owner.
	ErrHeld = sentinel.ErrHeld
	// ErrNotHeld means the caller does not hold the key: its grant was
	// released, expired, broken or replaced by a newer grant.
	ErrNotHeld = sentinel.ErrNotHeld
	// ErrLost is the cause given to a lease's context when the authority
	// says the lease is no longer ours.
	ErrLost = sentinel.ErrLost
	// ErrClosed means the client or driver has been closed.
	ErrClosed = sentinel.ErrClosed
	// ErrUnavailable means the authority could not be reached; nothing was
	// applied.
	ErrUnavailable = sentinel.ErrUnavailable
	// ErrUnknownOutcome means a request was sent but its outcome is
	// unknown (for example the connection broke after the write was sent).
	ErrUnknownOutcome = sentinel.ErrUnknownOutcome
	// ErrNotFound means an admin operation named a key the store has never
	// granted.
	ErrNotFound = sentinel.ErrNotFound
	// ErrUnsupported means the store does not offer an optional operation.
	ErrUnsupported = sentinel.ErrUnsupported
	// ErrInvalidKey means a key failed validation.
	ErrInvalidKey = sentinel.ErrInvalidKey
	// ErrInvalidTTL means a TTL, or another duration of a lease's terms,
	// failed validation.
	ErrInvalidTTL = sentinel.ErrInvalidTTL
	// ErrCheckpointTooLarge means a checkpoint was longer than 64 KiB;
	// nothing was written.
	ErrCheckpointTooLarge = sentinel.ErrCheckpointTooLarge
	// ErrInvalidURL means a store URL could not be parsed or names an
	// unknown scheme.
	ErrInvalidURL = sentinel.ErrInvalidURL
	// ErrInvalidFloor means a fence floor was out of range (above 2^61).
	ErrInvalidFloor = sentinel.ErrInvalidFloor
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
	// fence required). Errors about durations match ErrInvalidTTL as well.
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

// HeldError is returned (wrapped or bare) by TryAcquire, and by a
// driver's TryAcquire, when the key is held by someone else. It matches
// ErrHeld with errors.Is. It may carry a hint of how long the current
// grant has left, which pollers use to cap their sleep.
type HeldError struct {
	// Remaining is the time left on the current grant by the authority's
	// clock, or zero when unknown. A store without a server clock
	// (Capabilities().ServerClock false) reports instead how long until it
	// may take the grant over: what is left of its own watch of the
	// grant. Either way it is how long a poller should wait before trying
	// again, at most.
	Remaining time.Duration
}

// Error implements error. The key is not repeated. Whoever returns the
// error wraps it once with the operation and the key (fenced: acquire
// "k": lease held…).
func (e *HeldError) Error() string {
	if e.Remaining > 0 {
		return fmt.Sprintf("%v (about %v left)", ErrHeld, e.Remaining.Round(time.Millisecond))
	}
	return ErrHeld.Error()
}

// Is makes errors.Is(err, ErrHeld) true.
func (e *HeldError) Is(target error) bool { return target == ErrHeld }

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

// invalid returns an error matching ErrInvalidOptions (and ErrInvalidTTL
// for durations) about field.
func invalid(duration bool, field string, format string, args ...any) error {
	return &optionError{field: field, msg: fmt.Sprintf(format, args...), duration: duration}
}

// optionError is a refused lease option. Its text names the field alone,
// so a negative MaxWait never reads as an invalid TTL.
type optionError struct {
	field, msg string
	duration   bool // it also matches ErrInvalidTTL
}

func (e *optionError) Error() string {
	return ErrInvalidOptions.Error() + ": " + e.field + ": " + e.msg
}

// Is matches ErrInvalidOptions, and ErrInvalidTTL for a duration.
func (e *optionError) Is(target error) bool {
	return target == ErrInvalidOptions || e.duration && target == ErrInvalidTTL
}
