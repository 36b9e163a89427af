package fenced

import (
	"context"
	"errors"
	"time"

	"github.com/fenced-dev/fenced/driver"
)

// abandonLooks are the moments, after an acquisition gave up, at which
// abandon looks for the grant it may have left behind: at once, and a few
// times more, since a request the caller stopped waiting for can still be
// applied by the store a moment later (a statement waiting on a row lock
// runs on after its client has gone).
var abandonLooks = []time.Duration{0, 50 * time.Millisecond, 250 * time.Millisecond, time.Second}

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
// key (driver Inspect) at each of abandonLooks and releases the grant
// whose owner digest is owner's. It gives up after the last look, or
// after Options.CloseTimeout; Close waits for it.
//
// The caller must still be admitted (see admit), so that Close, which
// waits for admitted acquisitions, also waits for this.
func (c *Client) abandon(ctx context.Context, key, owner string, ttl time.Duration) {
	c.inflight.Add(1)
	go func() {
		defer c.inflight.Done()
		rctx, cancel := context.WithTimeout(haltable{Context: c.halt, values: ctx}, c.opts.CloseTimeout)
		defer cancel()
		digest := driver.OwnerDigest(owner)
		began := time.Now()
		for _, at := range abandonLooks {
			if wait := time.Until(began.Add(at)); wait > 0 {
				t := time.NewTimer(wait)
				select {
				case <-t.C:
				case <-c.closing.Done():
					// Close waits for this: look once more now, not later.
					t.Stop()
					c.releaseAbandoned(rctx, key, owner, digest, ttl)
					return
				case <-rctx.Done():
					t.Stop()
					return
				}
			}
			if c.releaseAbandoned(rctx, key, owner, digest, ttl) {
				return
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
