package fenced

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/core/token"
)

// TryAcquire acquires a lease on key without waiting: if the key is held it
// returns an error matching ErrHeld at once. opts may be nil; its MaxWait is
// checked but not used.
func (c *Client) TryAcquire(ctx context.Context, key string, opts *LeaseOptions) (*Lease, error) {
	return c.acquire(ctx, key, opts, true)
}

// Acquire acquires a lease on key, waiting while it is held for up to
// MaxWait (see LeaseOptions: zero, the default, not at all; WaitForever
// until ctx ends). Waiting uses the backend's notifications or native queue
// when it has them and polls with exponential backoff and full jitter
// otherwise. opts may be nil; Resolve shows what it resolves to.
//
// The returned lease outlives ctx: cancelling ctx stops the wait, not the
// lease. End the lease with Release. When the wait runs out the error
// matches ErrHeld; when ctx ends it matches ctx.Err(). A backend whose
// fence is weaker than MinFence fails with ErrNoFence. When the authority
// is unreachable the error matches ErrUnavailable, unless the lease may
// FailOpen. Once Close has begun the error matches ErrClosed.
func (c *Client) Acquire(ctx context.Context, key string, opts *LeaseOptions) (*Lease, error) {
	return c.acquire(ctx, key, opts, false)
}

func (c *Client) acquire(ctx context.Context, key string, opts *LeaseOptions, try bool) (*Lease, error) {
	// The clock is read for the hook only: reading it is not free on
	// every machine.
	var began time.Time
	if c.opts.Hook != nil {
		began = c.clock.Now()
	}
	ev := Event{Kind: EventAcquire, Key: key, Context: ctx}
	l, err := c.acquireChecked(ctx, key, opts, try, &ev)
	if c.opts.Hook != nil {
		ev.Duration = c.clock.Now().Sub(began)
	}
	if err != nil {
		err = fmt.Errorf("fenced: acquire %q: %w", key, err)
		ev.Err = err
	} else {
		ev.Fence = l.fence
		ev.Lease = l
	}
	c.emit(ev)
	return l, err
}

func (c *Client) acquireChecked(ctx context.Context, key string, opts *LeaseOptions, try bool, ev *Event) (*Lease, error) {
	if err := ValidateKey(key); err != nil {
		return nil, err
	}
	spec, err := c.Resolve(opts)
	if err != nil {
		return nil, err
	}
	if try {
		spec.MaxWait = 0
	}
	ev.MaxWait = spec.MaxWait
	dctx, id, cancel, err := c.admit(ctx)
	if err != nil {
		return nil, err
	}
	defer c.finish(id, cancel)
	if ctx.Err() != nil {
		return nil, ctxEnded(ctx)
	}
	return c.acquireLoop(ctx, dctx, key, spec, ev)
}

// acquireLoop acquires key. ctx is the caller's; dctx is ctx bounded by
// Close (see admit), for requests to the store.
func (c *Client) acquireLoop(ctx, dctx context.Context, key string, s LeaseOptions, ev *Event) (_ *Lease, err error) {
	w := &waiter{c: c, ctx: ctx, dctx: dctx, key: key, s: s, ev: ev, owner: s.OwnerTag + newOwner(), wait: s.MaxWait != 0}
	defer func() {
		if err != nil && w.unresolved {
			c.abandon(ctx, key, w.owner, s.TTL)
		}
	}()
	defer w.stopWaitTimer()
	if q := c.ops().Queuer; q != nil && w.wait {
		return w.queued(q)
	}
	defer w.leave()
	return w.poll()
}

// grantedTooLate reports whether a grant whose request was sent at sent
// would be past its local validity now: the answer came too late to use.
func (c *Client) grantedTooLate(sent time.Time, s LeaseOptions) bool {
	return c.now() >= c.since(sent)+s.validity()
}

// waitEnded reports, without blocking, whether the wait for a key must
// end: ctx is done or MaxWait ran out (waitOver fired).
func (c *Client) waitEnded(ctx context.Context, waitOver <-chan time.Time) bool {
	select {
	case <-waitOver:
		return true
	case <-ctx.Done():
		return true
	case <-c.closing.Done():
		return true
	default:
		return false
	}
}

// tryAcquire makes one grant request, with the lease's terms for drivers
// that take them.
func (c *Client) tryAcquire(ctx context.Context, key, owner string, s LeaseOptions) (uint64, error) {
	if ta := c.ops().TermsAcquirer; ta != nil {
		return ta.TryAcquireTerms(ctx, key, owner, s.TTL, s.SafetyMargin)
	}
	return c.drv.TryAcquire(ctx, key, owner, s.TTL)
}

// abandonFirstLooks are the moments, after an acquisition gave up, of
// abandon's first looks for the grant it may have left behind: at once,
// and soon after, since a request the caller stopped waiting for can still
// be applied by the store a moment later (a statement that had already
// started when its cancel arrived, a request waiting on a row lock).
var abandonFirstLooks = []time.Duration{0, 50 * time.Millisecond, 250 * time.Millisecond, time.Second}

// nextAbandonLook returns when abandon looks again after a look at at
// (time since it began): the next of abandonFirstLooks, then twice at, so
// that a grant the store made late is found within about as long again.
func nextAbandonLook(at time.Duration) time.Duration {
	for _, l := range abandonFirstLooks {
		if l > at {
			return l
		}
	}
	return 2 * at
}

// mayHaveGranted reports whether a grant request that failed with err may
// nonetheless have granted the key: its outcome is unknown, or the
// request's context ended while it was in flight (the driver's error then
// says nothing of what the store did).
func mayHaveGranted(dctx context.Context, err error) bool {
	return !refused(err) && (errors.Is(err, ErrUnknownOutcome) || dctx.Err() != nil)
}

// refused reports whether err says the store granted nothing: the key is
// held by another owner, or the request was invalid.
func refused(err error) bool {
	return errors.Is(err, ErrHeld) || errors.Is(err, ErrInvalidKey) ||
		errors.Is(err, ErrInvalidTTL) || errors.Is(err, ErrInvalidOptions)
}

// abandon releases, in the background, the grant of key to owner that an
// acquisition which is giving up may have been given (see
// mayHaveGranted): nobody holds that grant's lease, and it would keep the
// key from everybody for its whole TTL. The owner token was made before
// the first request, so the grant is found by it: abandon looks at the
// key (driver Inspect) and releases the grant whose owner digest is
// owner's.
//
// It looks at once, then at growing intervals (nextAbandonLook) until ttl
// has passed: a grant made by then would lapse by itself soon after, and a
// later one is not looked for. Each look may take until the next is due,
// or Options.CloseTimeout if that is longer: a look that waits for a busy
// store is not cut short while the grant may still be there. Close ends
// the looks after one last look, and waits for it.
//
// The caller must still be admitted (see admit), so that Close, which
// waits for admitted acquisitions, also waits for this.
func (c *Client) abandon(ctx context.Context, key, owner string, ttl time.Duration) {
	c.inflight.Add(1)
	go func() {
		defer c.inflight.Done()
		digest := token.Digest(owner)
		began := time.Now()
		look := func(until time.Duration) bool {
			budget := max(until-time.Since(began), c.opts.CloseTimeout)
			lctx, cancel := context.WithTimeout(haltable{Context: c.halt, values: ctx}, budget)
			defer cancel()
			return c.releaseAbandoned(lctx, key, owner, digest, ttl)
		}
		for at := time.Duration(0); ; {
			next := nextAbandonLook(at)
			if look(next) || at >= ttl || c.halt.Err() != nil {
				return
			}
			at = min(next, ttl)
			if wait := time.Until(began.Add(at)); wait > 0 {
				t := time.NewTimer(wait)
				select {
				case <-t.C:
				case <-c.closing.Done():
					// Close waits for this: look once more now, not later.
					t.Stop()
					look(0)
					return
				}
			}
		}
	}()
}

// releaseAbandoned looks at key once and releases its grant if owner
// holds it (digest is owner's digest). It reports whether it did.
func (c *Client) releaseAbandoned(ctx context.Context, key, owner, digest string, ttl time.Duration) bool {
	info, err := c.drv.Inspect(ctx, key)
	if err != nil || !info.Held || info.OwnerDigest != digest {
		return false
	}
	if err := c.drv.Release(ctx, driver.Grant{Key: key, Owner: owner, Fence: info.Fence, TTL: ttl}); err != nil {
		return false
	}
	c.signalRelease(key)
	return true
}
