package main

import (
	"fmt"
	"time"

	"github.com/fenced-dev/fenced"
)

// endingWindow returns how long before the hold's local validity ends
// fenced starts ending COMMAND's tree if no renewal has been confirmed by
// then, and a channel that fires when that moment comes. Waiting for the
// loss to send SIGTERM and giving --grace after it would let the tree run,
// and write with its fence, after the authority may have granted the key
// to another holder (TestRunUnderAttack/loss); so the tree gets SIGTERM
// --grace before the validity ends and SIGKILL shortly before its end.
// The window is at most half the validity the hold starts with: renewals
// every third of the TTL keep more than that left on a healthy lease.
func (s *supervision) endingWindow() (time.Duration, <-chan time.Time) {
	left := s.h.lease.Remaining()
	window := min(s.h.grace, left/2)
	return window, time.After(left - window)
}

// endUnrenewed ends the tree if the hold's validity has fallen within
// window (no renewal confirmed in time): SIGTERM now, SIGKILL half the
// window (at most 500ms) before the validity ends, or after --grace if
// sooner. Otherwise it returns the
// channel for the next check. fenced then exits 77.
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
	// SIGKILL goes out before the end, so that the last process is gone
	// by then even if finding them all takes a while (a /proc walk).
	kill := min(left-min(window/2, 500*time.Millisecond), s.h.grace)
	fmt.Fprintf(s.g.stderr, "fenced: %s has not been renewed and ends in %v; sending SIGTERM to %s and its processes, SIGKILL in %v\n",
		s.h.desc, left.Round(time.Millisecond), s.name, kill.Round(time.Millisecond))
	// The tree is ended for the loss to come: exit 77, as after one.
	s.unrenewed = true
	s.lost = fmt.Errorf("%w: no renewal confirmed with %v of its validity left", fenced.ErrLost, left.Round(time.Millisecond))
	if s.terminate() > 0 {
		s.killTimer = time.After(kill)
	}
	return nil
}

// awaitEnd waits, if the tree was ended unrenewed, until the hold ends
// (at most for its local validity left and a second), so no renewal is left in flight
// when fenced releases it and closes the client.
func (s *supervision) awaitEnd() {
	if !s.unrenewed {
		return
	}
	// Remaining reads the clock; the lease's own timer ends it just
	// after: allow it a moment.
	select {
	case <-s.h.lease.Done():
	case <-time.After(s.h.lease.Remaining() + time.Second):
	}
}
