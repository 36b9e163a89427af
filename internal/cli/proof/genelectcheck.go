package proof

import (
	"sort"
	"time"

	"github.com/fenced-dev/fenced/driver"
)

// ElectTiming is what CheckGenElect derives its recovery bound from.
type ElectTiming struct {
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// Keeps is the store's declared expiry (how long it keeps a grant
	// past its TTL).
	Keeps driver.Expiry
	// SchedDelay is the longest scheduling delay measured in the run.
	SchedDelay time.Duration
	// StoreStalls says a stopped process can stall the store (a SQLite
	// file: a process stopped inside a write holds its lock).
	StoreStalls bool
}

// GenElectReport is the checked outcome of an elector run (RunGenElect).
type GenElectReport struct {
	Seed     uint64
	Duration time.Duration
	// Faults counts the nemesis's faults by kind (cut, stop, kill,
	// break), Hurt those that struck the leader.
	Faults, Hurt map[string]int
	// Terms counts the terms whose work ran; NoLease those whose
	// OnStartedLeading found the lease already gone.
	Terms, NoLease int
	// WritesAccepted and WritesRefused count the resource's writes.
	WritesAccepted, WritesRefused int
	// Overlaps counts pairs of terms whose work contexts (LeaderContext;
	// with the hazard switch, client-go's) were seen live at once, the
	// one of the lower fence after the other: must be 0, except after a
	// break (BreakOverlaps: a broken lease may be used until its TTL
	// after the break, see Client.Break; longer is an overlap).
	Overlaps, BreakOverlaps int
	MaxBreakOverlap         time.Duration
	// CGOverlaps counts the same for client-go's own contexts where no
	// stop or break of the earlier term's process explains it: must be 0.
	// CGPauseOverlaps counts those after a SIGSTOP or a break (the
	// documented gap: client-go ends a term only after RenewDeadline of
	// failed renewals), MaxCGPauseOverlap the longest, MaxCGAfterResume
	// the longest a paused leader's client-go context was seen live after
	// it was continued.
	CGOverlaps, CGPauseOverlaps         int
	MaxCGPauseOverlap, MaxCGAfterResume time.Duration
	// StaleAccepted counts accepted writes with a fence below one
	// accepted before (or equal, from another process): must be 0.
	StaleAccepted int
	// Recoveries counts the faults that struck the leader;
	// LongestRecovery is the longest from such a fault to the first
	// sample of the next term's work context live, Bound its bound
	// (RecoveryKind the fault), MaxSchedDelay the measured delay in it.
	Recoveries                            int
	LongestRecovery, Bound, MaxSchedDelay time.Duration
	RecoveryKind                          string
	// Problems describes each violation; FirstViolation is how far into
	// the run the first one happened.
	Problems       []string
	FirstViolation time.Duration
}

// Failed reports whether any check failed.
func (r GenElectReport) Failed() bool { return len(r.Problems) > 0 }

// electTerm is what the samples show of one term: for the work context
// (w) and client-go's (cg), the first sample that saw it live (its T,
// taken after the check), the last (its TB, taken before), and the first
// that saw it ended (its T; 0 if none).
type electTerm struct {
	pid, slot int
	fence     uint64
	ttl       time.Duration
	w, cg     liveSpan
}

type liveSpan struct{ first, last, end int64 }

func (s *liveSpan) add(live bool, tb, t int64) {
	switch {
	case live && s.first == 0:
		s.first, s.last = t, tb
	case live:
		s.last = tb
	case s.end == 0:
		s.end = t
	}
}

// CheckGenElect judges an elector run from its history (samples, terms,
// faults) and the resource's accepted writes in commit order:
//
//   - no two work contexts live at once: for terms a and b with a's fence
//     below b's, a's work context must not be seen live (a check begun at
//     TB) after b's was (a check ended at T). All instants are
//     CLOCK_MONOTONIC, shared by the processes: no tolerance. A broken
//     term's may until its TTL after the break;
//   - the same for client-go's contexts, except after a stop or a break
//     of the earlier term's process: that gap is measured, and the
//     context must have ended by the end of the run;
//   - no stale write accepted: the fences the resource accepted never go
//     down;
//   - after each fault that struck the leader, the next term's work
//     context is live within a bound: the store's keep of the grant past
//     the last renewal (which came before the fault), then client-go's
//     next campaign (RetryPeriod × 2.2, its jitter), two samples, 3 × the
//     measured scheduling delay; after a break, the break's own duration
//     instead of the keep; on a store a stopped process can stall, plus
//     the stop.
func CheckGenElect(events []electEvent, writes []partWrite, tm ElectTiming) GenElectReport {
	c := &electChecker{
		rep:        GenElectReport{Faults: map[string]int{}, Hurt: map[string]int{}, MaxSchedDelay: tm.SchedDelay},
		tm:         tm,
		violations: violations{first: -1, since: "run"},
	}
	c.problems = &c.rep.Problems
	for _, e := range events {
		if c.t0 == 0 || e.T < c.t0 {
			c.t0 = e.T
		}
	}
	c.collect(events)
	for i, a := range c.terms {
		for _, b := range c.terms[i+1:] {
			c.checkPair(a, b)
		}
	}
	c.checkWrites(writes)
	c.checkRecoveries()
	if c.first >= 0 {
		c.rep.FirstViolation = time.Duration(c.first - c.t0)
	}
	return c.rep
}

// electChecker holds what CheckGenElect has learnt of a run.
// It fills rep as it goes.
type electChecker struct {
	rep GenElectReport
	tm  ElectTiming
	violations
	terms  []*electTerm // by fence, then by first sample live
	faults []electEvent // in the order of the history
}

// collect gathers the faults and the terms from the history, and counts.
func (c *electChecker) collect(events []electEvent) {
	type key struct {
		pid   int
		fence uint64
	}
	byKey := map[key]*electTerm{}
	for _, e := range events {
		switch e.K {
		case "fault":
			c.faults = append(c.faults, e)
			c.rep.Faults[e.Fault]++
			if e.Hurt {
				c.rep.Hurt[e.Fault]++
			}
		case "nolease":
			c.rep.NoLease++
		case "end":
			c.rep.WritesRefused += e.Refused
		case "lead", "s":
			k := key{e.PID, e.Fence}
			t := byKey[k]
			if t == nil {
				t = &electTerm{pid: e.PID, slot: e.Slot, fence: e.Fence}
				byKey[k] = t
			}
			if e.K == "lead" {
				t.ttl = e.TTL
				continue
			}
			t.w.add(e.W, e.TB, e.T)
			t.cg.add(e.CG, e.TB, e.T)
		}
	}
	for _, t := range byKey {
		c.terms = append(c.terms, t)
	}
	sort.Slice(c.terms, func(i, j int) bool {
		if c.terms[i].fence != c.terms[j].fence {
			return c.terms[i].fence < c.terms[j].fence
		}
		return c.terms[i].w.first < c.terms[j].w.first
	})
	c.rep.Terms = len(c.terms)
}

// excuse returns the fault of kind on a's process (or, for a break, its
// term) that explains an overlap with a term first seen live at before:
// the latest, if a's process was stopped more than once in its term.
func (c *electChecker) excuse(a *electTerm, before int64, kinds ...string) *electEvent {
	var found *electEvent
	for i := range c.faults {
		f := &c.faults[i]
		for _, k := range kinds {
			if f.Fault != k || f.T > before {
				continue
			}
			if k == "break" && f.Hurt && f.Fence == a.fence || k == "stop" && f.PID == a.pid && f.End >= a.cg.first {
				found = f
			}
		}
	}
	return found
}

// killedAfter reports whether process pid was killed at or after at.
func (c *electChecker) killedAfter(pid int, at int64) bool {
	for _, f := range c.faults {
		if f.Fault == "kill" && f.PID == pid && f.T >= at {
			return true
		}
	}
	return false
}

// checkPair checks terms a and b (a's fence not above b's) for overlaps.
func (c *electChecker) checkPair(a, b *electTerm) {
	if a.fence == b.fence {
		c.violation(b.w.first, "fence %d granted to two terms (pids %d and %d)", a.fence, a.pid, b.pid)
		return
	}
	if a.w.first != 0 && b.w.first != 0 && a.w.last > b.w.first {
		d := time.Duration(a.w.last - b.w.first)
		if br := c.excuse(a, b.w.first, "break"); br != nil && a.w.last <= br.End+int64(a.ttl) {
			c.rep.BreakOverlaps++
			c.rep.MaxBreakOverlap = max(c.rep.MaxBreakOverlap, d)
		} else {
			c.rep.Overlaps++
			c.violation(b.w.first,
				"two leaders at once for %v: the work context of fence %d (elector %d, pid %d) was seen live after that of fence %d "+
					"(elector %d, pid %d)",
				d.Round(time.Millisecond), a.fence, a.slot, a.pid, b.fence, b.slot, b.pid)
		}
	}
	if a.cg.first != 0 && b.cg.first != 0 && a.cg.last > b.cg.first {
		c.checkCGOverlap(a, b)
	}
}

// checkCGOverlap judges client-go's contexts of a and b, seen live at once.
func (c *electChecker) checkCGOverlap(a, b *electTerm) {
	d := time.Duration(a.cg.last - b.cg.first)
	f := c.excuse(a, b.cg.first, "stop", "break")
	if f == nil {
		c.rep.CGOverlaps++
		c.violation(b.cg.first,
			"client-go's contexts of fence %d (elector %d, pid %d) and fence %d (elector %d, pid %d) live at once for %v, "+
				"with no stop or break of the first",
			a.fence, a.slot, a.pid, b.fence, b.slot, b.pid, d.Round(time.Millisecond))
		return
	}
	c.rep.CGPauseOverlaps++
	c.rep.MaxCGPauseOverlap = max(c.rep.MaxCGPauseOverlap, d)
	switch {
	case a.cg.end != 0 && f.Fault == "stop":
		// Seen live after the resume: its end may be seen
		// later only because the process was stopped again.
		c.rep.MaxCGAfterResume = max(c.rep.MaxCGAfterResume, time.Duration(a.cg.last-f.End))
	case a.cg.end == 0 && !c.killedAfter(a.pid, b.cg.first):
		c.violation(b.cg.first, "client-go's context of fence %d (elector %d, pid %d) never ended after a %s of it", a.fence, a.slot, a.pid,
			f.Fault)
	}
}

// checkWrites checks the accepted writes, in commit order, for a stale one.
func (c *electChecker) checkWrites(writes []partWrite) {
	var last *partWrite
	for i := range writes {
		w := &writes[i]
		c.rep.WritesAccepted++
		if last != nil && (w.Fence < last.Fence || w.Fence == last.Fence && w.PID != last.PID) {
			c.rep.StaleAccepted++
			c.violation(w.T, "stale write accepted: fence %d by pid %d after fence %d by pid %d", w.Fence, w.PID, last.Fence, last.PID)
		}
		if last == nil || w.Fence >= last.Fence {
			last = w
		}
	}
}

// checkRecoveries checks that a next term began in time after each fault
// that struck the leader.
func (c *electChecker) checkRecoveries() {
	ttl := c.tm.LeaseDuration
	for _, t := range c.terms {
		ttl = max(ttl, t.ttl)
	}
	for _, f := range c.faults {
		if f.Hurt {
			c.checkRecovery(f, ttl)
		}
	}
}

// checkRecovery checks the recovery from fault f; ttl is the longest TTL.
func (c *electChecker) checkRecovery(f electEvent, ttl time.Duration) {
	tm := c.tm
	campaign := tm.RetryPeriod * 22 / 10
	c.rep.Recoveries++
	var next int64
	for _, t := range c.terms {
		if t.fence > f.Fence && t.w.first != 0 && (next == 0 || t.w.first < next) {
			next = t.w.first
		}
	}
	wait := tm.Keeps.Outlives(ttl)
	if f.Fault == "break" {
		wait = time.Duration(f.End - f.T)
	}
	var stall time.Duration
	if tm.StoreStalls && f.Fault == "stop" {
		stall = time.Duration(f.End - f.T)
	}
	bound := wait + campaign + 2*electSampleEvery + 3*tm.SchedDelay + stall
	if next == 0 {
		c.violation(f.T, "no leader after the %s of the leader (fence %d, elector %d) to the end of the run (bound %v)", f.Fault, f.Fence,
			f.Slot, bound.Round(time.Millisecond))
		return
	}
	d := max(0, time.Duration(next-f.T))
	if d > c.rep.LongestRecovery {
		c.rep.LongestRecovery, c.rep.Bound, c.rep.RecoveryKind = d, bound, f.Fault
	}
	if d > bound {
		c.violation(f.T,
			"no leader for %v after the %s of the leader (fence %d, elector %d): bound %v = %v (the store's keep of a %v grant, "+
				"or the break) + client-go's campaign %v (RetryPeriod × 2.2) + 2 samples %v + 3 × the measured scheduling delay %v + a "+
				"store stall by a stopped process %v",
			d.Round(time.Millisecond), f.Fault, f.Fence, f.Slot, bound.Round(time.Millisecond), wait.Round(time.Millisecond), ttl, campaign,
			2*electSampleEvery, tm.SchedDelay.Round(time.Millisecond), stall.Round(time.Millisecond))
	}
}
