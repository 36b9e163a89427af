package main

import (
	"fmt"
	"syscall"
	"time"

	"github.com/fenced-dev/fenced"
)

// tooBusy is what fenced says when SIGKILL went out only after the
// validity ended.
const tooBusy = "fenced did not run in time to end the tree (it was stopped, or the machine too busy)"

// maxKillLead is the most SIGKILL is sent ahead of the end of the local
// validity by default; a machine seen to be slow gets more (endUnrenewed).
const maxKillLead = 500 * time.Millisecond

// endingWindow arms the check that ends COMMAND's tree before the hold's
// local validity ends if no renewal has been confirmed by then, and
// returns the channel it fires on. Waiting for the loss to send SIGTERM
// and giving --grace after it would let the tree run, and write with its
// fence, after the authority may have granted the key to another holder
// (TestRunUnderAttack/loss); so an unrenewed tree gets SIGTERM, and
// SIGKILL --grace later but at the latest a lead before the validity
// ends: a quarter of the validity the hold starts with (at most
// maxKillLead), or more on a machine seen to be slow (see measure). The
// SIGTERM goes out --grace before that, but at most half the validity
// before its end: renewals every third of the TTL keep more than that left
// on a healthy lease.
func (s *supervision) endingWindow() <-chan time.Time {
	s.validity = s.h.lease.Remaining()
	s.killLead = killLeadFor(s.validity)
	s.endDue = time.Now()
	s.measure()
	return s.armEnding(s.h.lease.Remaining())
}

// killLeadFor is the default lead for a hold starting with validity: a
// quarter of it, at most maxKillLead.
func killLeadFor(validity time.Duration) time.Duration { return min(validity/4, maxKillLead) }

// lead is how long before the validity ends SIGKILL must go out: the
// default killLead, or twice what a round of signals has been seen to
// cost on this machine (cost), if that is more.
func (s *supervision) lead() time.Duration { return max(s.killLead, 2*s.cost) }

// setWindow sets how long before the validity ends an unrenewed tree gets
// SIGTERM: --grace, the lead, and the cost of the SIGTERM round itself,
// before the end; at most half the validity.
func (s *supervision) setWindow() {
	s.window = min(s.h.grace+s.lead()+s.cost, s.validity/2)
}

// armEnding returns a channel that fires when the validity left now has
// fallen to the window.
func (s *supervision) armEnding(left time.Duration) <-chan time.Time {
	s.validEnd = time.Now().Add(left)
	s.endDue = time.Now().Add(left - s.window)
	s.tellGuard()
	return time.After(left - s.window)
}

// tellGuard has the supervisor's guard kill the tree when fenced would
// kill it unrenewed, the lead before the validity ends, in case fenced
// does not run by then (stopped, starved, or killed and slow to die; see
// supervise.Group.KillBy). It is told again after every renewal (at
// least every guardEvery), so that moment moves with the validity. Once
// the tree is ending, fenced's own SIGKILL decides.
func (s *supervision) tellGuard() {
	left := s.h.lease.Remaining()
	if s.ending || left <= 0 {
		return
	}
	// Never sooner than fenced itself would kill: not before the window,
	// whatever a slow round of signals made the lead.
	s.guardAt = time.Now().Add(left - min(s.lead(), s.window))
	s.grp.KillBy(s.guardAt)
}

// guardEvery is how often the guard is told the validity: six times a
// validity, so a renewal (every third of the TTL) reaches it well before
// the moment it was last told.
func guardEvery(validity time.Duration) time.Duration {
	return max(validity/6, 10*time.Millisecond)
}

// measure records what ending the tree costs on this machine now: how
// late the ending check ran (a starved process runs its timers late) and
// how long a round of signal 0 to every process of the tree takes (a walk
// of /proc in process-tree mode, slow on a busy machine). It is measured
// as supervision begins and at each check of the window; a cost seen once
// is halved at each later check, so one slow moment does not last.
func (s *supervision) measure() {
	late := max(0, time.Since(s.endDue))
	start := time.Now()
	s.grp.SignalAll(0)
	s.cost = max(late+time.Since(start), s.cost/2)
	s.setWindow()
}

// endUnrenewed ends the tree if the hold's validity has fallen within the
// window (no renewal confirmed in time): SIGTERM now, SIGKILL after
// --grace or the lead before the validity ends, whichever is sooner; at
// once if that moment has passed while the SIGTERM went out, or without
// SIGTERM if the round would cost more than the time left before it. Otherwise it
// measures the machine's cost of ending the tree (measure) and returns
// the channel for the next check. fenced then exits 77.
func (s *supervision) endUnrenewed() <-chan time.Time {
	if s.ending {
		return nil
	}
	left := s.h.lease.Remaining()
	switch {
	case left > s.window:
		s.measure()
		return s.armEnding(s.h.lease.Remaining())
	case left == 0:
		return nil // lost: the loss ends the tree
	}
	late := max(0, time.Since(s.endDue))
	start := time.Now()
	// The tree is ended for the loss to come: exit 77, as after one.
	s.unrenewed = true
	s.lost = fmt.Errorf("%w: no renewal confirmed with %v of its validity left", fenced.ErrLost, left.Round(time.Millisecond))
	s.cost = max(s.cost, late)
	if left-s.cost < s.lead() {
		// No time for a round of SIGTERM (it would cost what a round has
		// cost here) before SIGKILL must go out.
		s.ending = true
		fmt.Fprintf(s.g.stderr,
			"fenced: %s has not been renewed and ends in %v, too soon for SIGTERM on this machine (%v late; "+
				"a round of signals takes about %v)\n",
			s.h.desc, left.Round(time.Millisecond), late.Round(time.Millisecond), s.cost.Round(time.Millisecond))
		s.kill("ran with the validity about to end")
		return nil
	}
	// SIGCONT goes to the group only: a stopped process that left it
	// cannot act on SIGTERM, but SIGKILL ends it all the same, and a
	// second round over the tree would eat into the time left.
	s.ending = true
	n := s.grp.SignalAll(syscall.SIGTERM)
	_ = s.grp.Signal(syscall.SIGCONT)
	took := time.Since(start)
	s.cost = max(s.cost, late+took)
	kill := max(0, min(s.h.grace, s.h.lease.Remaining()-s.lead()))
	fmt.Fprintf(s.g.stderr,
		"fenced: %s has not been renewed and ends in %v; sent SIGTERM to %s and its processes (%v late, taking %v), SIGKILL in %v\n",
		s.h.desc, left.Round(time.Millisecond), s.name, late.Round(time.Millisecond), took.Round(time.Millisecond),
		kill.Round(time.Millisecond))
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
// --grace, but at the latest the lead before the hold's local validity
// ends. A hold ended before its validity (a break, a refused renewal:
// Remaining is 0) gets --grace. One whose validity, as last checked, has
// run out unseen gets none: fenced (or a partition's supervisor) was
// stopped or starved past it, the store may have granted the key again,
// and --grace would let the tree write on
// (TestPartitionsRunUnderAttack/sigstop-supervisor). The check runs before
// that end whenever fenced runs, so a hold that ended while fenced ran is
// never mistaken for one.
func (s *supervision) killDelay() time.Duration {
	if s.ranOutUnseen() {
		return 0
	}
	left := s.h.lease.Remaining()
	if left <= 0 {
		return s.h.grace
	}
	return max(0, min(s.h.grace, left-s.lead()))
}

// ranOutUnseen reports whether the hold's validity has run out past the
// end the last ending check saw ahead: fenced did not run at that end.
func (s *supervision) ranOutUnseen() bool {
	return s.h.lease.Remaining() <= 0 && !s.validEnd.IsZero() && !time.Now().Before(s.validEnd)
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
		return fmt.Sprintf(" (in %v, %v before the lease's local validity ends)", took.Round(time.Millisecond),
			left.Round(time.Millisecond))
	case s.unrenewed:
		return fmt.Sprintf(" (in %v); the lease's local validity had ended by then: %s, and another holder may have been granted the key "+
			"meanwhile", took.Round(time.Millisecond), tooBusy)
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
