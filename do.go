package fenced

import (
	"context"
	"errors"
	"fmt"
)

// Do runs fn while holding a lease on key: it acquires the lease, calls fn
// with a context that is cancelled when either ctx ends or the lease is
// lost, and releases the lease when fn returns.
//
// Contention follows the resolved MaxWait, giving the two usual behaviours:
//
//   - NoWait (the default when neither opts nor the client's defaults set
//     MaxWait) skips: if another worker holds the key, fn does not run and
//     Do returns an error matching ErrHeld. Use it for periodic work, where
//     the next run will catch up. Say MaxWait: NoWait to skip even on a
//     client whose defaults wait.
//   - A positive MaxWait (or WaitForever) waits up to that long for the
//     key. Use it for work that must happen.
//
// If the lease is lost while fn runs, Do returns an error matching the
// loss cause (ErrLost or ErrExpired), joined with fn's own error: fn's
// writes may not all have counted, which is why they must carry the fence.
// When fn returns, the context it was given is cancelled before the key is
// freed, so goroutines fn left behind are told to stop before another
// worker can get the key. The release uses a fresh timeout of
// Options.CloseTimeout, so it happens even when ctx has ended.
func (c *Client) Do(ctx context.Context, key string, opts *LeaseOptions, fn func(ctx context.Context, l *Lease) error) error {
	l, err := c.Acquire(ctx, key, opts)
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(l.Context(), func() { cancel(context.Cause(l.Context())) })
	fnErr := fn(runCtx, l)
	stop()
	lostErr := l.Err() // nil unless the lease ended before fn returned
	cancel(ErrReleased)
	relCtx, relCancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.CloseTimeout)
	defer relCancel()
	relErr := l.Release(relCtx)
	if lostErr != nil {
		return errors.Join(fnErr, fmt.Errorf("fenced: do %q: lease ended while work ran: %w", key, lostErr))
	}
	if fnErr != nil {
		return fnErr
	}
	return relErr
}
