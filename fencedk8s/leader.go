package fencedk8s

import (
	"context"

	"github.com/fenced-dev/fenced"
)

// LeaderContext returns the context to do the leader's work under, and
// the term's lease (its Fence is the epoch to send with every write). Call
// it in OnStartedLeading with the context the elector passed. The context
// ends when ctx ends or when the lease ends, whichever comes first, with
// the lease's end cause (fenced.ErrLost, ErrExpired...). Its Err reads the
// lease's clock: after a pause past the lease's validity it reports the
// end at once, before any timer has run. When this candidate holds no
// lease (the term is already over), it returns an ended context and a nil
// lease.
func (r *ResourceLock) LeaderContext(ctx context.Context) (context.Context, *fenced.Lease) {
	cctx, cancel := context.WithCancelCause(ctx)
	l := r.Lease()
	if l == nil {
		cancel(ErrTermEnded)
		return cctx, nil
	}
	stop := context.AfterFunc(l.Context(), func() { cancel(context.Cause(l.Context())) })
	context.AfterFunc(cctx, func() { stop() })
	return &leaderContext{Context: cctx, lease: l, cancel: cancel}, l
}

// leaderContext is a context that also ends with a lease, and whose Err
// asks the lease (which reads its clock) before it answers.
type leaderContext struct {
	context.Context
	lease  *fenced.Lease
	cancel context.CancelCauseFunc
}

// Err ends the context first if the lease has ended, so it never says nil
// after the lease's validity ran out.
func (c *leaderContext) Err() error {
	if c.Context.Err() == nil {
		if err := c.lease.Err(); err != nil {
			c.cancel(err)
		}
	}
	return c.Context.Err()
}
