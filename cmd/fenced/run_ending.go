package main

import (
	"fmt"
	"time"
)

// endingWindow returns how long before the hold's local validity ends
// fenced starts ending COMMAND's tree if no renewal has been confirmed by
// then, and a channel that fires when that moment comes. Waiting for the
// loss to send SIGTERM and giving --grace after it would let the tree run,
// and write with its fence, after the authority may have granted the key
// to another holder (TestRunUnderAttack/loss); so the tree gets SIGTERM
// --grace before the validity ends and SIGKILL at its end at the latest.
// The window is at most half the validity the hold starts with: renewals
// every third of the TTL keep more than that left on a healthy lease.
func (s *supervision) endingWindow() (time.Duration, <-chan time.Time) {
	left := s.h.lease.Remaining()
	window := min(s.h.grace, left/2)
	return window, time.After(left - window)
}

// endUnrenewed ends the tree if the hold's validity has fallen within
// window (no renewal confirmed in time): SIGTERM now, SIGKILL when the
// validity ends, or after --grace if sooner. Otherwise it returns the
// channel for the next check.
func (s *supervision) endUnrenewed(window time.Duration) <-chan time.Time {
	if s.ending {
		return nil
	}
	left := s.h.lease.Remaining()
	switch {
	case left > window:
		return time.After(left - window)
	case left == 0:
		return nil // lost: the loss ends the tree
	}
	fmt.Fprintf(s.g.stderr, "fenced: %s has not been renewed and ends in %v; sending SIGTERM to %s and its processes, SIGKILL in %v\n",
		s.h.desc, left.Round(time.Millisecond), s.name, min(left, s.h.grace).Round(time.Millisecond))
	if s.terminate() > 0 {
		s.killTimer = time.After(min(left, s.h.grace))
	}
	return nil
}
