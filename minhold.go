package fenced

import (
	"context"
	"time"
)

// checkMinHold checks s.MinHold against the rest of s (MaxHold,
// ManualRenew and the local validity must already be resolved).
func (s *LeaseOptions) checkMinHold() error {
	switch {
	case s.MinHold < 0:
		return invalid(true, "MinHold", "%v is negative", s.MinHold)
	case s.MinHold > 0 && s.MaxHold != HoldForever && s.MinHold > s.MaxHold:
		return invalid(true, "MinHold", "%v is longer than MaxHold %v, after which renewal stops and the lease expires", s.MinHold, s.MaxHold)
	case s.MinHold > 0 && s.ManualRenew && s.MinHold >= s.validity():
		return invalid(true, "MinHold", "%v is not shorter than the local validity %v with ManualRenew: the lease would end before the hold", s.MinHold, s.validity())
	}
	return nil
}

// HoldAtLeast waits until the lease's MinHold has passed since granted,
// the time its holder learnt of the grant. It returns sooner when the
// lease ends or ctx is done. It does not release the lease. Adapters that
// release a lease themselves (a scheduler's Unlock) call it first. Do
// calls it after its work.
func (l *Lease) HoldAtLeast(ctx context.Context, granted time.Time) {
	left := l.spec.MinHold - time.Since(granted)
	if left <= 0 {
		return
	}
	t := time.NewTimer(left)
	defer t.Stop()
	select {
	case <-t.C:
	case <-l.ctx.Done():
	case <-ctx.Done():
	}
}
