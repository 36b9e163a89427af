package fenced

import (
	"context"
	"time"
)

// Hooks observe what the client does, so metrics and tracing adapters plug
// in without touching backends (package metrics and its fencedprom and
// fencedotel adapters are built on them). Every field may be nil. Hooks run
// synchronously on the client's goroutines and must not block.
//
// Every event about a granted lease carries the *Lease. An adapter can
// follow a lease by pointer from its grant to its end.
type Hooks struct {
	// AcquireAttempt is called before each request to the authority.
	AcquireAttempt func(AttemptEvent)
	// Acquired is called once per Acquire, TryAcquire or Do call with the
	// outcome.
	Acquired func(AcquireEvent)
	// Renewed is called after each renewal attempt.
	Renewed func(RenewEvent)
	// Lost is called once when a held lease is lost or expires locally.
	Lost func(LostEvent)
	// Released is called when the holder releases a lease.
	Released func(ReleaseEvent)
	// StaleWrite is called by guards in package fence when a resource refuses
	// a write with an old fence: a pause or partition that really happened.
	StaleWrite func(StaleWriteEvent)
}

// AttemptEvent describes one request to the authority.
type AttemptEvent struct {
	Key     string
	Attempt int // 1-based
	// Context is the context passed to Acquire, TryAcquire or Do, so that
	// a tracing hook can parent what it records to the caller's span. Hooks
	// must not keep it past their return.
	Context context.Context
}

// AcquireEvent is the outcome of one acquisition.
type AcquireEvent struct {
	Key      string
	Fence    uint64
	Attempts int
	// MaxWait is the resolved wait of the call: NoWait (TryAcquire, a
	// lease that does not wait, or refused options), WaitForever or a
	// positive duration. It tells a refusal at once (ErrHeld with NoWait)
	// from a wait that ran out (ErrHeld after a positive MaxWait).
	MaxWait time.Duration
	// Waited is the time from the call to the outcome.
	Waited time.Duration
	// Contended reports whether the key was found held at least once.
	Contended bool
	// FailedOpen reports a lease granted locally because the authority was
	// unavailable and the lease has FailOpen set.
	FailedOpen bool
	// Err is nil on success.
	Err error
	// Lease is the granted lease, nil when Err is not nil.
	Lease *Lease
	// Context is the context passed to Acquire, TryAcquire or Do (see
	// AttemptEvent.Context).
	Context context.Context
}

// RenewEvent is the outcome of one renewal.
type RenewEvent struct {
	Err error
	// Lease is the renewed lease (its Key and Fence say which).
	Lease *Lease
}

// LostEvent says a lease was lost before it was released.
type LostEvent struct {
	// Held is how long the lease was held.
	Held time.Duration
	// Cause matches ErrLost (the authority said so; also ErrBroken when
	// the store's audit log shows that an admin broke this grant) or
	// ErrExpired (local validity ran out).
	Cause error
	// Lease is the lost lease.
	Lease *Lease
}

// ReleaseEvent is the outcome of a release.
type ReleaseEvent struct {
	Held time.Duration
	Err  error
	// Cause is the lease's end cause: ErrReleased after Release, ErrClosed
	// after Client.Close, or the loss cause of a lease lost before it was
	// released (its Lost event came first).
	Cause error
	// Lease is the released lease.
	Lease *Lease
}

// StaleWriteEvent is reported by guards that refuse a write.
type StaleWriteEvent struct {
	Key string
	// Presented is the fence the writer sent; Current is the newer fence the
	// resource had seen.
	Presented, Current uint64
	// Resource names the guarded resource (a table, a Redis key, a URL path).
	Resource string
}

func (h Hooks) attempt(e AttemptEvent) {
	if h.AcquireAttempt != nil {
		h.AcquireAttempt(e)
	}
}

func (h Hooks) acquired(e AcquireEvent) {
	if h.Acquired != nil {
		h.Acquired(e)
	}
}

func (h Hooks) renewed(e RenewEvent) {
	if h.Renewed != nil {
		h.Renewed(e)
	}
}

func (h Hooks) lost(e LostEvent) {
	if h.Lost != nil {
		h.Lost(e)
	}
}

func (h Hooks) released(e ReleaseEvent) {
	if h.Released != nil {
		h.Released(e)
	}
}

// ReportStaleWrite forwards a refused write to the StaleWrite hook, if any.
// Guards call it; it is safe with a nil hook.
func (h Hooks) ReportStaleWrite(e StaleWriteEvent) {
	if h.StaleWrite != nil {
		h.StaleWrite(e)
	}
}

// Client returns the client that granted the lease. Guards in package fence
// use it to report stale writes of the lease's tokens to the client's Hooks
// when they have no hooks of their own.
func (l *Lease) Client() *Client { return l.c }
