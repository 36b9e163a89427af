package main

import (
	"fmt"
	"time"

	"github.com/fenced-dev/fenced"
)

// maxKillLead is the most SIGKILL is sent ahead of the end of the local
// validity by default; a machine seen to be slow gets more (endUnrenewed).
const maxKillLead = 500 * time.Millisecond

// endingWindow arms the check that ends COMMAND's tree before the hold's
// local validity ends if no renewal has been confirmed by then, and
// returns the channel it fires on. Waiting for the loss to send SIGTERM
// and giving --grace after it would let the tree run, and write with its
// fence, after the authority may have granted the key to another holder
// (TestRunUnderAttack/loss); so an unrenewed tree gets SIGTERM, and
// SIGKILL --grace later but at the latest killLead before the validity
// ends: a quarter of the validity the hold starts with, at most
// maxKillLead. The SIGTERM goes out --grace before that, but at most half
// the validity before its end: renewals every third of the TTL keep more
// than that left on a healthy lease.
func (s *supervision) endingWindow() <-chan time.Time {
	left := s.h.lease.Remaining()
	s.killLead = min(left/4, maxKillLead)
	s.window = min(s.h.grace+s.killLead, left/2)
	return s.armEnding(left)
}

// armEnding returns a channel that fires when the validity left now has
// fallen to the window.
func (s *supervision) armEnding(left time.Duration) <-chan time.Time {
	s.endDue = time.Now().Add(left - s.window)
	return time.After(left - s.window)
}

// endUnrenewed ends the tree if the hold's validity has fallen within the
// window (no renewal confirmed in time): SIGTERM now, SIGKILL after
// --grace or killLead before the validity ends, whichever is sooner.
// Where this check ran late, or the SIGTERM round (a walk of /proc in
// process-tree mode) was slow, the machine is busy: SIGKILL then goes out
// twice that cost ahead of the end, if that is more than killLead, so that
// it lands before the authority can grant the key again. Otherwise it
// returns the channel for the next check. fenced then exits 77.
func (s *supervision) endUnrenewed() <-chan time.Time {
	if s.ending {
		return nil
	}
	left := s.h.lease.Remaining()
	switch {
	case left > s.window:
		return s.armEnding(left)
	case left == 0:
		return nil // lost: the loss ends the tree
	}
	late := max(0, time.Since(s.endDue))
	start := time.Now()
	// The tree is ended for the loss to come: exit 77, as after one.
	s.unrenewed = true
	s.lost = fmt.Errorf("%w: no renewal confirmed with %v of its validity left", fenced.ErrLost, left.Round(time.Millisecond))
	n := s.sigterm()
	cost := late + time.Since(start)
	lead := max(s.killLead, 2*cost)
	kill := s.killDelay(lead)
	fmt.Fprintf(s.g.stderr, "fenced: %s has not been renewed and ends in %v; sent SIGTERM to %s and its processes (%v late, taking %v), SIGKILL in %v\n",
		s.h.desc, left.Round(time.Millisecond), s.name, late.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), kill.Round(time.Millisecond))
	switch {
	case n == 0:
		s.killAgain = time.NewTicker(100 * time.Millisecond) // in case one was forking
	case kill <= 0:
		s.kill("ran with the validity about to end")
	default:
		s.killTimer = time.After(kill)
	}
	return nil
}

// killDelay returns how long after now SIGKILL goes out once SIGTERM has:
// --grace, but at the latest lead before the hold's local validity ends.
// A hold whose validity is not known (lost: Remaining is 0) gets --grace.
func (s *supervision) killDelay(lead time.Duration) time.Duration {
	left := s.h.lease.Remaining()
	if left <= 0 {
		return s.h.grace
	}
	return max(0, min(s.h.grace, left-lead))
}

// validityNote says, for the SIGKILL message, how much of the hold's
// validity was left once SIGKILL had gone out (took is how long that
// took), or that it had ended: then the machine was too slow for fenced
// to end the tree in time, and another holder may have been granted the
// key meanwhile.
func (s *supervision) validityNote(took time.Duration) string {
	left := s.h.lease.Remaining()
	switch {
	case left > 0:
		return fmt.Sprintf(" (in %v, %v before the lease's local validity ends)", took.Round(time.Millisecond), left.Round(time.Millisecond))
	case s.unrenewed:
		return fmt.Sprintf(" (in %v); the lease's local validity had ended by then: this machine was too busy for fenced to end the tree in time, and another holder may have been granted the key meanwhile", took.Round(time.Millisecond))
	}
	return fmt.Sprintf(" (in %v)", took.Round(time.Millisecond))
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
