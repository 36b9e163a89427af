package proof

import (
	"fmt"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/fenced-dev/fenced"
)

// Report is the checker's verdict on one run.
type Report struct {
	// Injections is how many times the fault was injected.
	Injections int `json:"runs"`
	// Grants counts the leases granted.
	Grants int `json:"grants"`
	// WritesAccepted counts the appends the resource accepted.
	WritesAccepted int `json:"writes_accepted"`
	// StaleAttempted counts writes sent after a newer grant of the key
	// (higher fence, or the same fence to another owner) was confirmed to
	// its holder; StaleRefused counts those the resource refused.
	StaleAttempted int `json:"stale_attempted"`
	StaleRefused   int `json:"stale_refused"`
	// StaleAccepted counts writes the resource accepted after it had
	// accepted a write with a higher fence for the key (or the same fence
	// from another owner), in the resource's own order. A stale write
	// that reaches the resource before the newer holder's first write is
	// not counted here (the resource had nothing newer); with the
	// write-only ordering it shows as a lost update: a duplicate effect
	// and a linearizability violation.
	StaleAccepted int `json:"stale_accepted"`
	// FenceRegressions counts grants whose fence is lower than that of a
	// grant of the same key confirmed before they were requested (on a
	// backend whose fence may repeat, unless the lower fence reissues one
	// granted before: that is the declared repeat), and, when the
	// backend's fence is strict, pairs of grants to different owners with
	// one fence (a repeat), in whatever order.
	FenceRegressions int `json:"fence_regressions"`
	// FenceRepeats counts pairs of grants to different owners with one
	// fence on a backend whose fence may repeat (declared; the guard's
	// owner rule refuses the second holder's writes).
	FenceRepeats int `json:"fence_repeats"`
	// Overlaps counts pairs of holders of one key who both believed they
	// held it at the same time (from the confirmed grant to the moment the
	// holder learnt of the loss, released, or died); LongestOverlap is the
	// longest such interval.
	Overlaps       int           `json:"overlaps"`
	LongestOverlap time.Duration `json:"longest_overlap_ns"`
	// DuplicateEffects counts invoices sent more than once (each extra
	// copy counts one).
	DuplicateEffects int `json:"duplicate_effects"`
	// Linearizable says whether porcupine found the history of the ledger
	// linearizable against a fenced append log (see model);
	// Linearizability is porcupine's verdict: "Ok", "Illegal" or "Unknown"
	// (timed out).
	Linearizable    bool   `json:"linearizable"`
	Linearizability string `json:"linearizability"`
	// Recovery is the longest time from a fault to the next grant: from
	// its start for a worker fault (to a grant to another worker), from
	// its end for an authority fault.
	Recovery time.Duration `json:"recovery_ns"`
	// Errors counts operations that failed with an error (acquire, read or
	// write with an unknown outcome), not refusals.
	Errors int `json:"errors"`
	// HazardSeen says the run showed a hazard: a stale write accepted, a
	// duplicate effect or a non-linearizable history.
	HazardSeen bool `json:"hazard_seen"`
	// Problems lists what the checker could not reconcile (a worker said a
	// write was accepted that the resource does not have, and so on):
	// bugs in the harness or the system, never expected.
	Problems []string `json:"problems,omitempty"`
}

// Check examines a run's history and the resource's final contents.
// strength is the backend's declared fence strength. A lock that gives no
// fence (FenceNone or none declared: a Locker) is judged by the fences an
// ideal lock would have issued. The checker first derives them, per key, in
// the order the grants were confirmed. res is then changed in place.
func Check(events []Event, res Contents, strength fenced.FenceStrength) Report {
	sort.SliceStable(events, func(i, j int) bool { return events[i].T < events[j].T })
	if strength <= fenced.FenceNone {
		deriveFences(events, &res)
	}
	c := newRunChecker(events, res, strength)
	c.collectGrants()
	c.checkGrantPairs()
	c.checkStaleAttempts()
	c.checkLedgerOrder()
	c.measureRecovery()
	r := &c.r
	r.Linearizability, r.Problems = checkLedger(events, res, c.end)
	r.Linearizable = r.Linearizability == string(porcupine.Ok)
	r.HazardSeen = r.StaleAccepted > 0 || r.DuplicateEffects > 0 || !r.Linearizable
	c.reconcileWrites()
	return c.r
}

// runGrant is one lease granted in a run, until its holder lost or
// released it, or died (end).
type runGrant struct {
	key, owner string
	fence      uint64
	invoke, ok int64
	worker     int
	pid        int
	end        int64
}

// runChecker holds what Check has learnt of a run, one method per check.
// It fills r as it goes.
type runChecker struct {
	r        Report
	events   []Event // in time order
	res      Contents
	strength fenced.FenceStrength
	end      int64 // just after the last event
	inLedger map[int64]LedgerRow
	grants   []*runGrant // in the order they were confirmed
}

// newRunChecker returns a checker of events (in time order) and res.
func newRunChecker(events []Event, res Contents, strength fenced.FenceStrength) *runChecker {
	c := &runChecker{events: events, res: res, strength: strength, inLedger: map[int64]LedgerRow{}}
	if len(events) > 0 {
		c.end = events[len(events)-1].T + 1
	}
	for _, l := range res.Ledger {
		c.inLedger[l.Op] = l
	}
	c.r.WritesAccepted = len(res.Ledger)
	return c
}

// collectGrants gathers the grants, per key, and when each one ended.
// It counts the failed operations too.
func (c *runChecker) collectGrants() {
	invokes := map[int64]int64{}
	byOwner := map[string]*runGrant{}
	for _, e := range c.events {
		switch e.Kind {
		case AcquireInvoke:
			invokes[e.Op] = e.T
		case AcquireOK:
			g := &runGrant{key: e.Key, owner: e.Owner, fence: e.Fence, invoke: invokes[e.Op], ok: e.T, worker: e.Worker, pid: e.PID,
				end: c.end}
			c.grants = append(c.grants, g)
			byOwner[e.Owner] = g
		case Lost, ReleaseInvoke:
			if g := byOwner[e.Owner]; g != nil && e.T < g.end {
				g.end = e.T
			}
			if e.Kind == Lost && e.Owner == "" {
				// Lost carries the key and fence only.
				for _, g := range c.grants {
					if g.key == e.Key && g.fence == e.Fence && g.pid == e.PID && e.T < g.end && e.T >= g.ok {
						g.end = e.T
					}
				}
			}
		case FaultStart:
			if e.Fault == string(KillHolder) {
				for _, g := range c.grants {
					if g.pid == e.PID && e.T < g.end {
						g.end = e.T
					}
				}
			}
		case AcquireFail, ReadFail, WriteFail:
			c.r.Errors++
		}
	}
	c.r.Grants = len(c.grants)
}

// reissued says whether g's fence was granted to another owner of the
// key before g: on a backend whose fence may repeat (an asynchronous
// failover rolls the counter back), a lower fence that reissues one
// already granted is the declared hazard, counted as a repeat with
// that grant, not as a regression.
func (c *runChecker) reissued(g *runGrant) bool {
	for _, o := range c.grants {
		if o != g && o.key == g.key && o.fence == g.fence && o.owner != g.owner && o.ok < g.ok {
			return true
		}
	}
	return false
}

// checkGrantPairs compares each pair of grants of one key: their fences,
// and whether both holders believed they held it at once.
func (c *runChecker) checkGrantPairs() {
	r := &c.r
	for i, a := range c.grants {
		for _, b := range c.grants[i+1:] {
			if a.key != b.key {
				continue
			}
			// Two grants with one fence are a repeat whatever their order
			// (an acquire that waited may have been invoked before the
			// other grant was confirmed); a lower fence is a regression
			// where the real-time order of the grants is known.
			first, second := a, b
			if b.ok < a.invoke {
				first, second = b, a
			}
			switch {
			case a.fence == b.fence && a.owner != b.owner && c.strength >= fenced.FenceStrict:
				r.FenceRegressions++
			case a.fence == b.fence && a.owner != b.owner:
				r.FenceRepeats++
			case first.ok < second.invoke && second.fence < first.fence:
				if c.strength >= fenced.FenceStrict || !c.reissued(second) {
					r.FenceRegressions++
				}
			}
			lo, hi := max(a.ok, b.ok), min(a.end, b.end)
			if hi > lo && a.owner != b.owner {
				r.Overlaps++
				r.LongestOverlap = max(r.LongestOverlap, time.Duration(hi-lo))
			}
		}
	}
}

// newer reports whether a grant of key newer than (f, owner) was
// confirmed before at.
func (c *runChecker) newer(key string, f uint64, owner string, at int64) bool {
	for _, g := range c.grants {
		if g.key == key && g.ok < at && (g.fence > f || (g.fence == f && g.owner != owner)) {
			return true
		}
	}
	return false
}

// checkStaleAttempts counts the stale writes attempted: sent (or, delayed,
// landed) after a newer grant was confirmed. It counts those refused too.
func (c *runChecker) checkStaleAttempts() {
	// A delayed write (M2) is judged by when it reached the resource.
	landed := map[int64]int64{}
	for _, e := range c.events {
		if e.Kind == FaultEnd && e.Fault == string(DelayWrite) && e.Op != 0 {
			landed[e.Op] = e.T
		}
	}
	for _, e := range c.events {
		at := e.T
		if t, ok := landed[e.Op]; ok && e.Kind == WriteInvoke {
			at = t
		}
		if e.Kind != WriteInvoke || !c.newer(e.Key, e.Fence, e.Owner, at) {
			continue
		}
		c.r.StaleAttempted++
		if _, ok := c.inLedger[e.Op]; !ok {
			c.r.StaleRefused++
		}
	}
}

// checkLedgerOrder counts the stale writes accepted, in the resource's
// order, and the invoices sent more than once.
func (c *runChecker) checkLedgerOrder() {
	type mark struct {
		fence uint64
		owner string
	}
	top := map[string]mark{}
	for _, l := range c.res.Ledger {
		m, seen := top[l.Key]
		if seen && (l.Fence < m.fence || (l.Fence == m.fence && l.Owner != m.owner)) {
			c.r.StaleAccepted++
			continue
		}
		top[l.Key] = mark{l.Fence, l.Owner}
	}
	for _, byN := range c.res.Invoices {
		for _, n := range byN {
			if n > 1 {
				c.r.DuplicateEffects += n - 1
			}
		}
	}
}

// measureRecovery counts the injections and measures the longest recovery.
func (c *runChecker) measureRecovery() {
	for i, e := range c.events {
		if e.Kind != FaultStart && !(e.Kind == FaultEnd && e.Worker < 0) {
			continue
		}
		if e.Kind == FaultStart {
			c.r.Injections++
			if e.Worker < 0 || e.Fault == string(DelayWrite) {
				continue // measured from the end / not a holder fault
			}
		}
		for _, n := range c.events[i+1:] {
			if n.Kind == AcquireOK && (e.Worker < 0 || n.Worker != e.Worker) {
				c.r.Recovery = max(c.r.Recovery, time.Duration(n.T-e.T))
				break
			}
		}
	}
}

// reconcileWrites adds a problem for each write a worker reported that
// the resource contradicts.
func (c *runChecker) reconcileWrites() {
	for _, e := range c.events {
		if e.Kind == WriteOK {
			if _, ok := c.inLedger[e.Op]; !ok {
				c.r.Problems = append(c.r.Problems,
					fmt.Sprintf("worker %d reported write op %d accepted, but the resource has no such append", e.Worker, e.Op))
			}
		}
		if e.Kind == WriteRefused {
			if _, ok := c.inLedger[e.Op]; ok {
				c.r.Problems = append(c.r.Problems,
					fmt.Sprintf("worker %d reported write op %d refused, but the resource has it", e.Worker, e.Op))
			}
		}
	}
}
