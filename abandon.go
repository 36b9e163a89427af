package fenced

import (
	"context"
	"errors"
	"time"

	"github.com/fenced-dev/fenced/driver"
)

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
	return errors.Is(err, ErrHeld) || errors.Is(err, driver.ErrInvalidKey) || errors.Is(err, driver.ErrInvalidTTL) || errors.Is(err, ErrInvalidOptions)
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
		digest := driver.OwnerDigest(owner)
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
