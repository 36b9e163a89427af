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
// strength is the backend's declared fence strength. For a lock that gives
// no fence (FenceNone or FenceUnset: a Locker), the checker first derives
// the fences an ideal lock would have issued, per key in the order the
// grants were confirmed, and judges the run by them; res is then changed
// in place.
func Check(events []Event, res Contents, strength fenced.FenceStrength) Report {
	sort.SliceStable(events, func(i, j int) bool { return events[i].T < events[j].T })
	if strength <= fenced.FenceNone {
		deriveFences(events, &res)
	}
	var r Report
	end := int64(0)
	if len(events) > 0 {
		end = events[len(events)-1].T + 1
	}
	inLedger := map[int64]LedgerRow{}
	for _, l := range res.Ledger {
		inLedger[l.Op] = l
	}
	r.WritesAccepted = len(res.Ledger)

	// Grants, per key.
	type grant struct {
		key, owner string
		fence      uint64
		invoke, ok int64
		worker     int
		pid        int
		end        int64
	}
	invokes := map[int64]int64{}
	var grants []*grant
	byOwner := map[string]*grant{}
	for _, e := range events {
		switch e.Kind {
		case AcquireInvoke:
			invokes[e.Op] = e.T
		case AcquireOK:
			g := &grant{key: e.Key, owner: e.Owner, fence: e.Fence, invoke: invokes[e.Op], ok: e.T, worker: e.Worker, pid: e.PID, end: end}
			grants = append(grants, g)
			byOwner[e.Owner] = g
		case Lost, ReleaseInvoke:
			if g := byOwner[e.Owner]; g != nil && e.T < g.end {
				g.end = e.T
			}
			if e.Kind == Lost && e.Owner == "" {
				// Lost carries the key and fence only.
				for _, g := range grants {
					if g.key == e.Key && g.fence == e.Fence && g.pid == e.PID && e.T < g.end && e.T >= g.ok {
						g.end = e.T
					}
				}
			}
		case FaultStart:
			if e.Fault == string(KillHolder) {
				for _, g := range grants {
					if g.pid == e.PID && e.T < g.end {
						g.end = e.T
					}
				}
			}
		case AcquireFail, ReadFail, WriteFail:
			r.Errors++
		}
	}
	r.Grants = len(grants)
	// reissued says whether g's fence was granted to another owner of the
	// key before g: on a backend whose fence may repeat (an asynchronous
	// failover rolls the counter back), a lower fence that reissues one
	// already granted is the declared hazard, counted as a repeat with
	// that grant, not as a regression.
	reissued := func(g *grant) bool {
		for _, o := range grants {
			if o != g && o.key == g.key && o.fence == g.fence && o.owner != g.owner && o.ok < g.ok {
				return true
			}
		}
		return false
	}
	for i, a := range grants {
		for _, b := range grants[i+1:] {
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
			case a.fence == b.fence && a.owner != b.owner && strength >= fenced.FenceStrict:
				r.FenceRegressions++
			case a.fence == b.fence && a.owner != b.owner:
				r.FenceRepeats++
			case first.ok < second.invoke && second.fence < first.fence:
				if strength >= fenced.FenceStrict || !reissued(second) {
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

	// Stale writes attempted: sent (or, delayed, landed) after a newer
	// grant was confirmed.
	newer := func(key string, f uint64, owner string, at int64) bool {
		for _, g := range grants {
			if g.key == key && g.ok < at && (g.fence > f || (g.fence == f && g.owner != owner)) {
				return true
			}
		}
		return false
	}
	// A delayed write (M2) is judged by when it reached the resource.
	landed := map[int64]int64{}
	for _, e := range events {
		if e.Kind == FaultEnd && e.Fault == string(DelayWrite) && e.Op != 0 {
			landed[e.Op] = e.T
		}
	}
	for _, e := range events {
		at := e.T
		if t, ok := landed[e.Op]; ok && e.Kind == WriteInvoke {
			at = t
		}
		if e.Kind != WriteInvoke || !newer(e.Key, e.Fence, e.Owner, at) {
			continue
		}
		r.StaleAttempted++
		if _, ok := inLedger[e.Op]; !ok {
			r.StaleRefused++
		}
	}
	// Stale writes accepted, in the resource's order.
	type mark struct {
		fence uint64
		owner string
	}
	top := map[string]mark{}
	for _, l := range res.Ledger {
		m, seen := top[l.Key]
		if seen && (l.Fence < m.fence || (l.Fence == m.fence && l.Owner != m.owner)) {
			r.StaleAccepted++
			continue
		}
		top[l.Key] = mark{l.Fence, l.Owner}
	}
	for _, byN := range res.Invoices {
		for _, c := range byN {
			if c > 1 {
				r.DuplicateEffects += c - 1
			}
		}
	}

	// Injections and recovery.
	for i, e := range events {
		if e.Kind != FaultStart && !(e.Kind == FaultEnd && e.Worker < 0) {
			continue
		}
		if e.Kind == FaultStart {
			r.Injections++
			if e.Worker < 0 || e.Fault == string(DelayWrite) {
				continue // measured from the end / not a holder fault
			}
		}
		for _, n := range events[i+1:] {
			if n.Kind == AcquireOK && (e.Worker < 0 || n.Worker != e.Worker) {
				r.Recovery = max(r.Recovery, time.Duration(n.T-e.T))
				break
			}
		}
	}

	r.Linearizability, r.Problems = checkLedger(events, res, end)
	r.Linearizable = r.Linearizability == string(porcupine.Ok)
	r.HazardSeen = r.StaleAccepted > 0 || r.DuplicateEffects > 0 || !r.Linearizable
	for _, e := range events {
		if e.Kind == WriteOK {
			if _, ok := inLedger[e.Op]; !ok {
				r.Problems = append(r.Problems, fmt.Sprintf("worker %d reported write op %d accepted, but the resource has no such append", e.Worker, e.Op))
			}
		}
		if e.Kind == WriteRefused {
			if _, ok := inLedger[e.Op]; ok {
				r.Problems = append(r.Problems, fmt.Sprintf("worker %d reported write op %d refused, but the resource has it", e.Worker, e.Op))
			}
		}
	}
	return r
}
