package proof

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/fenced-dev/fenced"
)

// GenReport is the checker's verdict on a generative run.
type GenReport struct {
	// Seed is the run's seed: rerun with it to draw the same operations
	// and faults.
	Seed uint64 `json:"seed"`
	// Ops counts the operations invoked, ByOp per kind of operation;
	// Grants counts the leases granted (each lease of a set once).
	Ops    int            `json:"ops"`
	ByOp   map[string]int `json:"by_op"`
	Grants int            `json:"grants"`
	// CPUShare is the share of a CPU a runnable thread of the run got
	// (1: an idle core; 0.2: a machine busy with five times as much work
	// as it has cores), measured by RunGen.
	CPUShare float64 `json:"cpu_share,omitempty"`
	// MaxHeld is the most leases one worker held at once.
	MaxHeld int `json:"max_held"`
	// Faults counts the faults the nemesis injected.
	Faults int `json:"faults"`
	// FenceRegressions counts grants with a fence lower than one
	// confirmed on the key before they were invoked, and (strict fence)
	// pairs of grants to different owners with one fence; FenceRepeats
	// counts the latter where the backend declares its fence repeatable.
	FenceRegressions int `json:"fence_regressions"`
	FenceRepeats     int `json:"fence_repeats"`
	// LivePastValidity counts the samples in which a worker saw a lease's
	// context live past the lease's local validity (by more than the
	// grace) on its own clock; MaxOvershoot is the largest such overshoot.
	LivePastValidity int           `json:"live_past_validity"`
	MaxOvershoot     time.Duration `json:"max_overshoot_ns"`
	// Orphans counts grants that no Acquire returned (their owner is in no
	// grant of the history) seen held for longer than a TTL;
	// SlowOrphans counts those still held the orphan bound after every
	// acquisition on the key that may have left them had completed, while
	// neither the authority nor those acquisitions' workers were faulted; OrphansSeen counts every such grant seen
	// at all (released in time or not).
	Orphans     int `json:"orphans"`
	SlowOrphans int `json:"slow_orphans"`
	OrphansSeen int `json:"orphans_seen"`
	// SetsHealthyWithLost counts sets reported healthy while a member had
	// ended: when AcquireAll returned (a newer grant of a member's key had
	// been confirmed setMargin before), or when the worker looked.
	SetsHealthyWithLost int `json:"sets_healthy_with_lost"`
	// OutlivedBreak counts leases seen live more than their TTL after a
	// Break of them completed; Overlaps counts grants of a key to one
	// owner while another's lease on it lived on (see checkExclusion).
	OutlivedBreak int `json:"outlived_break"`
	// RenewedAfterBreak counts leases a worker broke itself and then saw
	// renewed by a request sent after the break.
	RenewedAfterBreak int `json:"renewed_after_break"`
	Overlaps          int `json:"overlaps"`
	// Errors counts failed acquisitions (refusals included).
	Errors int `json:"errors"`
	// Problems describes the first violations found; FirstViolation is
	// how long into the run the earliest one happened.
	Problems       []string      `json:"problems,omitempty"`
	FirstViolation time.Duration `json:"first_violation_ns,omitempty"`

	start int64
}

// Failed reports whether the run broke a promise.
func (r GenReport) Failed() bool {
	return r.FenceRegressions > 0 || r.LivePastValidity > 0 || r.Orphans > 0 || r.SlowOrphans > 0 || r.SetsHealthyWithLost > 0 || r.OutlivedBreak > 0 || r.RenewedAfterBreak > 0 || r.Overlaps > 0
}

// problem records a violation that happened at t.
func (r *GenReport) problem(t int64, format string, args ...any) {
	if d := time.Duration(t - r.start); r.FirstViolation == 0 || d < r.FirstViolation {
		r.FirstViolation = max(d, 1)
	}
	if len(r.Problems) < 20 {
		r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
	}
}

// setMargin is how long before AcquireAll returned a newer grant of a
// member's key must have been confirmed for the set to count as returned
// with a lost member: the worker records the return a moment after
// AcquireAll last confirmed its leases, and a break in that moment is no
// fault of AcquireAll's.
const setMargin = 250 * time.Millisecond

// CheckGen examines a generative run's history. strength is the backend's
// declared fence strength, ttl the longest an orphan grant can stand at
// the store (the longest TTL one can have, as the store keeps it:
// driver.Expiry.Outlives of its Capabilities.Keeps), bound how long one may be seen held while no fault is
// active.
func CheckGen(events []Event, strength fenced.FenceStrength, ttl, bound time.Duration) GenReport {
	sort.SliceStable(events, func(i, j int) bool { return events[i].T < events[j].T })
	r := GenReport{ByOp: map[string]int{}}
	if len(events) > 0 {
		r.start = events[0].T
	}
	type grant struct {
		key, owner  string
		fence       uint64
		invoke, ok  int64
		worker      int
		op          int64
		setHealthy  bool
		setMember   bool
		invokeKnown bool
	}
	type opKey struct {
		op  int64
		key string
	}
	invokes := map[opKey]int64{}
	seenOp := map[int64]bool{}
	var grants []*grant
	returned := map[string]bool{}
	// span bounds a grant's life from below, from the listings that saw
	// it: it was held at some instant of each listing (between its Asked
	// and T), so it began by the first listing's T (first) and lasted
	// until at least the last listing's Asked (last). A listing can take
	// up to its timeout, so its T alone would make a grant look longer.
	type span struct{ first, last int64 }
	// A grant is its key, owner and fence: an acquisition that retries
	// after its grant lapsed (its reply was lost, or came too late) asks
	// again as the same owner and may be granted the key anew.
	type grantID struct {
		key, owner string
		fence      uint64
	}
	observed := map[grantID]*span{}
	// acq is one acquisition: the keys it was invoked on, when, and when
	// it completed (0: never), and whether it failed.
	type acq struct {
		name         string
		worker       int
		keys         []string
		invoke, done int64
		failed       bool
	}
	acqs := map[int64]*acq{}
	holding := map[int]int{} // leases held, per worker
	var faults []faultWindow
	var renewedAfterBreak []Event
	open := map[string]int{}
	end := int64(0)
	if len(events) > 0 {
		end = events[len(events)-1].T
	}
	for _, e := range events {
		switch e.Kind {
		case AcquireInvoke, BreakInvoke:
			invokes[opKey{e.Op, e.Key}] = e.T
			if e.Kind == AcquireInvoke {
				a := acqs[e.Op]
				if a == nil {
					a = &acq{name: e.Name, worker: e.Worker, invoke: e.T}
					acqs[e.Op] = a
				}
				a.keys = append(a.keys, e.Key)
			}
			if !seenOp[e.Op] {
				seenOp[e.Op] = true
				r.Ops++
				r.ByOp[e.Name]++
			}
		case ReleaseInvoke:
			holding[e.Worker]--
		case AcquireOK, SetMember:
			holding[e.Worker]++
			r.MaxHeld = max(r.MaxHeld, holding[e.Worker])
			if a := acqs[e.Op]; a != nil && a.done == 0 {
				a.done = e.T
			}
			inv, known := invokes[opKey{e.Op, e.Key}]
			grants = append(grants, &grant{key: e.Key, owner: e.Owner, fence: e.Fence, invoke: inv, invokeKnown: known, ok: e.T, worker: e.Worker, op: e.Op, setMember: e.Kind == SetMember, setHealthy: e.Kind == SetMember && e.Value == 1})
			returned[e.Owner] = true
		case AcquireFail:
			r.Errors++
			if a := acqs[e.Op]; a != nil && a.done == 0 {
				a.done, a.failed = e.T, true
			}
		case LivePastValidity:
			r.LivePastValidity++
			r.MaxOvershoot = max(r.MaxOvershoot, time.Duration(e.Value))
			r.problem(e.T, "worker %d: lease on %s (fence %d) live %v past its local validity", e.Worker, e.Key, e.Fence, time.Duration(e.Value))
		case RenewedAfterBreak:
			renewedAfterBreak = append(renewedAfterBreak, e)
		case SetHealthyLost:
			r.SetsHealthyWithLost++
			r.problem(e.T, "worker %d: a set reported healthy while its lease on %s (fence %d) had ended: %s", e.Worker, e.Key, e.Fence, e.Err)
		case Observed:
			if e.Owner == "" {
				continue
			}
			k := grantID{e.Key, e.Owner, e.Fence}
			asked := e.T
			if e.Asked != 0 {
				asked = e.Asked
			}
			if s := observed[k]; s != nil {
				s.first, s.last = min(s.first, e.T), max(s.last, asked)
			} else {
				observed[k] = &span{e.T, asked}
			}
		case FaultStart:
			r.Faults++
			open[fmt.Sprintf("%s/%d", e.Fault, e.Worker)] = len(faults)
			faults = append(faults, faultWindow{e.T, end, e.Worker, e.Fault})
		case FaultEnd:
			if i, ok := open[fmt.Sprintf("%s/%d", e.Fault, e.Worker)]; ok {
				faults[i].end = e.T
			}
		}
	}
	r.Grants = len(grants)

	// Fences, per key in the order the grants were confirmed.
	byKey := map[string][]*grant{}
	for _, g := range grants {
		byKey[g.key] = append(byKey[g.key], g)
	}
	for key, gs := range byKey {
		// gs is in ok order (events were sorted).
		prefixMax := make([]uint64, len(gs))
		var m uint64
		owners := map[uint64]string{}
		for i, g := range gs {
			m = max(m, g.fence)
			prefixMax[i] = m
			if o, ok := owners[g.fence]; ok && o != g.owner {
				if strength >= fenced.FenceStrict {
					r.FenceRegressions++
					r.problem(g.ok, "%s: fence %d granted to two owners", key, g.fence)
				} else {
					r.FenceRepeats++
				}
			}
			owners[g.fence] = g.owner
		}
		// maxBefore returns the highest fence confirmed before t.
		maxBefore := func(t int64) uint64 {
			i := sort.Search(len(gs), func(i int) bool { return gs[i].ok >= t })
			if i == 0 {
				return 0
			}
			return prefixMax[i-1]
		}
		for _, g := range gs {
			if g.invokeKnown {
				if f := maxBefore(g.invoke); g.fence < f && strength >= fenced.FenceStrict {
					r.FenceRegressions++
					r.problem(g.ok, "%s: fence %d granted (worker %d) after fence %d was confirmed", key, g.fence, g.worker, f)
				}
			}
			if g.setHealthy {
				if f := maxBefore(g.ok - int64(setMargin)); f > g.fence {
					r.SetsHealthyWithLost++
					r.problem(g.ok, "%s: AcquireAll (worker %d, op %d) returned a healthy set whose lease (fence %d) was already superseded by fence %d", key, g.worker, g.op, g.fence, f)
				}
			}
		}
	}

	// Orphans: grants nobody was handed.
	for k, s := range observed {
		if returned[k.owner] {
			continue
		}
		r.OrphansSeen++
		held := max(0, time.Duration(s.last-s.first))
		if held <= bound {
			continue
		}
		// The acquisitions that may have left it: those invoked on its key
		// (or, for a semaphore, on the name its permit keys start with)
		// before it was seen, not completed a TTL before, that failed or
		// take several grants (a set, a permit, a campaign). A grant such
		// an acquisition holds while it runs is not an orphan. The Client
		// looks for the grant of a failed one for a second and releases
		// it; the orphan counts only if it was still held the bound after
		// each of them completed, and neither their workers nor the
		// authority were faulted from a second before each completed to
		// the bound after.
		var from []*acq
		for _, a := range acqs {
			if a.invoke > s.first+int64(200*time.Millisecond) || (a.done != 0 && a.done < s.first-int64(ttl)) {
				continue
			}
			if !a.failed && a.done != 0 && !multiGrant(a.name) {
				continue
			}
			for _, key := range a.keys {
				if key == k.key || strings.HasPrefix(k.key, key+"#") {
					from = append(from, a)
					break
				}
			}
		}
		// The hard limit: held past the TTL once nothing that may still
		// return it runs, with the authority answering. An acquisition
		// running when the grant was first seen may be the one that made it: a set holds the grants it has
		// got while it waits for the rest, for as long as its MaxWait, and
		// a single-key acquisition whose request was applied while the
		// authority was unreachable learns of its grant (or gives up and
		// releases it) only once it is back. So the count starts when the
		// last such acquisition completed; one still running at the end
		// of the history does not stop it.
		orphanFrom := s.first
		for _, a := range from {
			if a.done != 0 {
				orphanFrom = max(orphanFrom, a.done)
			}
		}
		// Nor while the authority could not answer (paused, or killed and
		// not yet answering again): no delete reaches it, and etcd gives
		// every session a full TTL again when it restarts. The count
		// starts again when the last such fault in the grant's life ended.
		for _, f := range faults {
			if f.worker < 0 && f.start <= s.last && f.end >= orphanFrom {
				orphanFrom = max(orphanFrom, f.end)
			}
		}
		if free := time.Duration(s.last - orphanFrom); free > ttl+time.Second {
			r.Orphans++
			r.problem(orphanFrom+int64(ttl), "%s: a grant no Acquire returned (owner %.8s, fence %d) was held for %v, %v of it after the acquisitions that could return it ended, past its TTL", k.key, k.owner, k.fence, held, free)
			continue
		}
		// A queued waiter that missed its turn: its single-key acquisition
		// (not a try, which never queues) went on waiting while its grant
		// stood at the authority, for more than the TTL (a slow authority
		// may take seconds to answer), with no fault active from a second before the
		// grant was seen until the acquisition completed, and the grant
		// went only as the acquisition gave up (within 250 ms of it).
		missed := false
		for _, a := range from {
			if multiGrant(a.name) || a.name == "try" || a.done == 0 || a.done-s.first <= int64(ttl) || s.last < a.done-int64(250*time.Millisecond) {
				continue
			}
			if !faultIn(faults, a.worker, s.first-int64(time.Second), a.done) {
				missed = true
				r.SlowOrphans++
				r.problem(s.first+int64(ttl), "%s: a waiter's grant (owner %.8s, fence %d) stood %v while its acquisition (worker %d) went on waiting, with no fault active", k.key, k.owner, k.fence, time.Duration(a.done-s.first), a.worker)
				break
			}
		}
		if missed {
			continue
		}
		quiet := len(from) > 0
		for _, c := range from {
			if c.done == 0 || s.last < c.done+int64(bound) || faultIn(faults, c.worker, c.done-int64(time.Second), c.done+int64(bound)) {
				quiet = false
				break
			}
		}
		if quiet {
			r.SlowOrphans++
			r.problem(s.first+int64(bound), "%s: a grant no Acquire returned (owner %.8s, fence %d) was held for %v with no fault active", k.key, k.owner, k.fence, held)
		}
	}
	for _, e := range renewedAfterBreak {
		// A restart of an authority that may lose data (its fence is
		// repeatable) may bring the broken key back.
		excused := false
		for _, f := range faults {
			if strength < fenced.FenceStrict && f.fault == string(CrashAuthority) && f.start <= e.T && f.start >= e.T-int64(10*time.Second) {
				excused = true
			}
		}
		if !excused {
			r.RenewedAfterBreak++
			r.problem(e.T, "worker %d: its lease on %s (fence %d) was renewed by a request sent after the worker broke it (validity %v past the break plus the TTL)", e.Worker, e.Key, e.Fence, time.Duration(e.Value).Round(time.Millisecond))
		}
	}
	checkExclusion(&r, events, strength, faults)
	return r
}

// multiGrant reports whether an acquisition of the named kind takes
// several grants, holding those it has while it waits for the rest: a set
// (AcquireAll), a semaphore permit, an election campaign.
func multiGrant(name string) bool { return name == "all" || name == "sem" || name == "elect" }

// faultIn reports whether a fault on worker (or on the authority, worker
// -1) was active at some time in [from, to].
func faultIn(faults []faultWindow, worker int, from, to int64) bool {
	for _, f := range faults {
		if (f.worker < 0 || f.worker == worker) && f.start <= to && f.end >= from {
			return true
		}
	}
	return false
}
