package fenced

import (
	"context"
	"strconv"
	"time"
)

// EventKind says what an Event reports.
type EventKind int

// The kinds of Event, and the fields each one sets. Fields a kind does not
// name are zero.
const (
	// EventAttempt: a request to the authority is about to be sent. Key,
	// Attempt (1-based) and Context are set.
	EventAttempt EventKind = iota + 1
	// EventAcquire: an Acquire, TryAcquire or Do call has its outcome.
	// Key, Context, Attempt (requests sent), MaxWait, Duration (the time
	// from the call to the outcome) and Contended are set. So is Err on
	// failure; on success, Lease and Fence.
	EventAcquire
	// EventRenew: a renewal has its outcome. Lease is set, and Err when it
	// failed.
	EventRenew
	// EventLost: a held lease was lost, once. Lease, Duration (how long
	// it was held) and Err are set. Err matches ErrLost (also ErrBroken
	// when the store's break log names this grant) or ErrExpired.
	EventLost
	// EventRelease: the holder's Release or Client.Close ended a grant.
	// Lease and Duration are set, and Err when the release failed.
	// Lease.Err gives the end cause: ErrReleased, ErrClosed, or the loss
	// cause of a lease lost first (its EventLost came before).
	EventRelease
	// EventStaleWrite: a guard in package fence refused a write with an
	// old fence, a pause or partition that really happened. Key, Fence
	// (the fence presented), Current (the newer fence the resource has
	// seen) and Resource (a table, a Redis key, a URL path) are set.
	EventStaleWrite
)

// String returns the kind's name without its prefix ("acquire", "lost"),
// or "EventKind(N)" for a value that names no kind.
func (k EventKind) String() string {
	switch k {
	case EventAttempt:
		return "attempt"
	case EventAcquire:
		return "acquire"
	case EventRenew:
		return "renew"
	case EventLost:
		return "lost"
	case EventRelease:
		return "release"
	case EventStaleWrite:
		return "stale-write"
	}
	return "EventKind(" + strconv.Itoa(int(k)) + ")"
}

// Event is what a client reports to Options.Hook. Kind says which fields
// are set. Every event about a granted lease carries the *Lease, so an
// adapter can follow a lease by pointer from its grant to its end.
type Event struct {
	Kind EventKind
	Key  string
	// Lease is the lease the event is about, nil when none was granted.
	Lease *Lease
	// Err is the outcome's error, or the loss cause (EventLost).
	Err   error
	Fence uint64
	// Context is the caller's context (EventAttempt, EventAcquire), so a
	// tracing hook can parent its spans to the caller's. Do not keep it.
	Context context.Context
	// Attempt is the attempt number (EventAttempt) or the requests sent
	// (EventAcquire).
	Attempt int
	// MaxWait is the resolved wait: zero (TryAcquire, a lease that does
	// not wait, refused options), WaitForever or a positive duration. It
	// tells a refusal at once from a wait that ran out.
	MaxWait time.Duration
	// Duration is the wait (EventAcquire) or the hold (EventLost,
	// EventRelease).
	Duration time.Duration
	// Contended reports that the key was found held at least once.
	Contended bool
	// Current and Resource describe a refused write (EventStaleWrite).
	Current  uint64
	Resource string
}

// emit calls c's hook with e, if c has one.
func (c *Client) emit(e Event) {
	if c.opts.Hook != nil {
		c.opts.Hook(e)
	}
}

// keyGroupKey is the context key of an acquisition's key group.
type keyGroupKey struct{}

// WithKeyGroup returns ctx marked so that hooks group the acquisitions made
// with it under group. Recipes use it: a semaphore marks its permits'
// acquisitions with its name, so metrics count one group per semaphore,
// not one per slot.
func WithKeyGroup(ctx context.Context, group string) context.Context {
	return context.WithValue(ctx, keyGroupKey{}, group)
}

// KeyGroup returns the group WithKeyGroup put in ctx, for hooks reading the
// Context of an AttemptEvent or AcquireEvent.
func KeyGroup(ctx context.Context) (group string, ok bool) {
	if ctx == nil {
		return "", false
	}
	group, ok = ctx.Value(keyGroupKey{}).(string)
	return group, ok
}
