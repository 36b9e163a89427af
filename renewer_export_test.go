package fenced

import (
	"context"
	"time"
)

// RenewerLoops returns how many times c's schedule loop has looked at its
// leases, for tests of how often it is woken.
func RenewerLoops(c *Client) int64 { return c.renew.loops.Load() }

// HandOutLease hands out a lease on a grant of key whose request was sent
// at sent, as Acquire does once the store has answered, bypassing the
// check Acquire makes first: tests of the schedule use it to hand out a
// grant that is already past its validity (the process stopped between
// that check and the hand-out).
func HandOutLease(c *Client, key, owner string, fence uint64, sent time.Time, opts *LeaseOptions) (*Lease, error) {
	s, err := c.Resolve(opts)
	if err != nil {
		return nil, err
	}
	return c.newLease(context.Background(), key, owner, fence, sent, s)
}
