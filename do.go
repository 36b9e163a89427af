package fenced

import (
	"context"
	"fmt"
	"time"
)

// Do runs fn while holding a lease on key: it acquires the lease, calls fn
// with a context that is cancelled when either ctx ends or the lease is
// lost, and releases the lease when fn returns.
//
// Contention follows the resolved MaxWait, giving the two usual behaviours:
//
//   - A zero MaxWait (the default) skips: if another worker holds the key, fn
//     does not run and Do returns an error matching ErrHeld. Use it for
//     periodic work, where the next run will catch up.
//   - A positive MaxWait (or WaitForever) waits up to that long for the
//     key. Use it for work that must happen.
//
// If the lease ends while fn runs, Do returns a *LeaseEndedError (wrapped
// with the key; find it with errors.As), which
// matches the cause (ErrLost or ErrExpired when the lease was lost, so
// IsLost is true; ErrClosed when the client was closed) and fn's own
// error. Its WorkErr tells whether fn finished: nil means fn returned nil
// and what it committed with the fence stands ("committed, then lost");
// otherwise fn failed, usually because the loss cancelled its context or a
// resource refused its fence ("lost before the work was done"). Writes that
// did not carry the fence may have landed after the loss either way.
//
//	err := client.Do(ctx, key, opts, work)
//	var ended *fenced.LeaseEndedError
//	switch {
//	case errors.As(err, &ended) && ended.WorkErr == nil:
//		log.Printf("done, but the lease was lost at the end: %v", err)
//	case err != nil:
//		return err // retry later, under a new lease
//	}
//
// When fn returns, its context is cancelled before the key is freed. So
// goroutines fn left behind are told to stop before another worker can get
// the key. The release has a fresh timeout of Options.CloseTimeout, so it
// happens even when ctx has ended.
//
// With a MinHold, Do keeps the lease after fn returns, with or without an
// error, until MinHold has passed since Acquire returned. An end of ctx or
// of the lease cuts that short. A duplicate started a little later
// elsewhere finds the key held.
//
// A nil fn is refused with ErrInvalidOptions before anything is acquired.
func (c *Client) Do(ctx context.Context, key string, opts *LeaseOptions, fn func(ctx context.Context, l *Lease) error) error {
	if fn == nil {
		return fmt.Errorf("%w: Do %q: the work function is nil", ErrInvalidOptions, key)
	}
	l, err := c.Acquire(ctx, key, opts)
	if err != nil {
		return err
	}
	granted := time.Now()
	// fn runs under the lease's own context when ctx can never end: that
	// context has ctx's values, ends when the lease does, and is cancelled
	// by the Release below before the key is freed. Otherwise fn's context
	// ends with either.
	runCtx := l.Context()
	var (
		cancel context.CancelCauseFunc
		stop   func() bool
	)
	if _, hasDeadline := ctx.Deadline(); ctx.Done() != nil || hasDeadline {
		runCtx, cancel = context.WithCancelCause(ctx)
		stop = context.AfterFunc(l.Context(), func() { cancel(context.Cause(l.Context())) })
	}
	fnErr := fn(runCtx, l)
	if stop != nil {
		stop()
	}
	lostErr := l.Err() // nil unless the lease ended before fn returned
	if cancel != nil {
		cancel(ErrReleased)
	}
	if lostErr == nil {
		l.HoldAtLeast(ctx, granted)
	}
	relCtx, relCancel := context.WithTimeout(withoutCancel(ctx), c.opts.CloseTimeout)
	defer relCancel()
	relErr := l.Release(relCtx)
	if lostErr != nil {
		return fmt.Errorf("fenced: do %q: %w", key, &LeaseEndedError{Fence: l.Fence(), Cause: lostErr, WorkErr: fnErr})
	}
	if fnErr != nil {
		return fnErr
	}
	return relErr
}
