package fencedk8s

import (
	"context"
	"fmt"
	"time"

	"github.com/fenced-dev/fenced"
)

// How client-go's elector (leaderelection.go, renew) ends a term: after a
// successful renewal it waits RetryPeriod, then tries to renew every
// RetryPeriod under a context that ends RenewDeadline later; when that
// context ends without a success it cancels the term. So after a success
// the term lasts at most RetryPeriod + RenewDeadline, plus however late the
// elector's timers run. The lock adds a tenth (slack) for the lateness.

// need returns how much validity a renewal must leave: RetryPeriod +
// RenewDeadline + slack.
func need(o Options) time.Duration {
	d := o.RetryPeriod + o.RenewDeadline
	return d + slack(o)
}

// slack is the lateness of the elector's timers the lock allows for: a
// tenth of RetryPeriod + RenewDeadline.
func slack(o Options) time.Duration { return (o.RetryPeriod + o.RenewDeadline) / 10 }

// ttlFor returns the TTL of a lease for a record with leaseSeconds
// (LeaseDurationSeconds, zero for a LeaseDuration under a second): the
// elector's LeaseDuration, or 1.2 ×
// (RetryPeriod + RenewDeadline) when that is longer, so that a renewal
// leaves need with a tenth of RetryPeriod + RenewDeadline to spare for its
// round trip.
func ttlFor(o Options, leaseSeconds int) time.Duration {
	return max(time.Duration(leaseSeconds)*time.Second, need(o)+slack(o))
}

// checkDeadline fails a renewal of a term whose context gives the elector
// longer than Options.RenewDeadline: the elector's RenewDeadline is then
// longer than the lock was told, and its term could outlive the lease.
func (r *ResourceLock) checkDeadline(ctx context.Context, leading bool) error {
	dl, ok := ctx.Deadline()
	if !leading || !ok {
		return nil
	}
	if left := time.Until(dl); left > r.opts.RenewDeadline {
		return fmt.Errorf("%w: election %q: the elector's renewal may take %v, more than Options.RenewDeadline %v: set Options.RenewDeadline and RetryPeriod to the elector's",
			ErrTiming, r.name, left.Round(time.Millisecond), r.opts.RenewDeadline)
	}
	return nil
}

// checkRemaining fails a grant or renewal of l that leaves less than need:
// the elector, told it succeeded, could keep its term past the lease.
func (r *ResourceLock) checkRemaining(l *fenced.Lease) error {
	if left, n := l.Remaining(), need(r.opts); left < n {
		return fmt.Errorf("%w: election %q: the lease has %v left after its renewal, less than RetryPeriod %v + RenewDeadline %v + %v",
			ErrTiming, r.name, left.Round(time.Millisecond), r.opts.RetryPeriod, r.opts.RenewDeadline, slack(r.opts))
	}
	return nil
}
