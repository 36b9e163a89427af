package proof

import (
	"fmt"
	"sort"
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
	// been confirmed setMargin before the set's health was read, and no
	// Break of the member's grant ended after AcquireAll began to confirm
	// it, which no confirmation could see), or when the worker looked.
	SetsHealthyWithLost int `json:"sets_healthy_with_lost"`
	// OutlivedBreak counts leases seen live more than their TTL after a
	// Break of them completed; Overlaps counts grants of a key to one
	// owner while another's lease on it lived on (see checkExclusion).
	OutlivedBreak int `json:"outlived_break"`
	// RenewedAfterBreak counts leases a worker broke itself and then saw
	// renewed by a request sent after the break.
	RenewedAfterBreak int `json:"renewed_after_break"`
	Overlaps          int `json:"overlaps"`
	// Piped counts the scripts the workers' Redis drivers sent through
	// their pipeline (calls that overlapped others on one client): the
	// checks above covered them too. Zero on other stores.
	Piped int64 `json:"piped,omitempty"`
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
	return r.FenceRegressions > 0 || r.LivePastValidity > 0 || r.Orphans > 0 || r.SlowOrphans > 0 || r.SetsHealthyWithLost > 0 ||
		r.OutlivedBreak > 0 || r.RenewedAfterBreak > 0 || r.Overlaps > 0
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
// declared fence strength. ttl is the longest an orphan grant can stand at
// the store. That is the longest TTL one can have, as the store keeps it:
// driver.Expiry.Outlives of its Capabilities.Keeps. bound is how long one
// may be seen held while no fault is active.
func CheckGen(events []Event, strength fenced.FenceStrength, ttl, bound time.Duration) GenReport {
	sort.SliceStable(events, func(i, j int) bool { return events[i].T < events[j].T })
	c := newGenChecker(events, strength, ttl, bound)
	for _, e := range events {
		c.record(e)
	}
	c.r.Grants = len(c.grants)
	for _, n := range c.piped {
		c.r.Piped += n
	}
	c.checkFences()
	c.checkOrphans()
	c.checkRenewedAfterBreak()
	checkExclusion(&c.r, events, strength, c.faults)
	return c.r
}

// genGrant is one grant a worker was handed: a lease, or a set's member.
type genGrant struct {
	key, owner  string
	fence       uint64
	invoke, ok  int64
	worker      int
	op          int64
	setHealthy  bool
	setMember   bool
	invokeKnown bool
	// confirmed is, for a set member, when AcquireAll began to confirm it
	// (Event.Confirmed); 0 for its last key, or unknown.
	confirmed int64
}

// opKey names one key of one operation.
type opKey struct {
	op  int64
	key string
}

// grantSpan bounds a grant's life from below, from the listings that saw
// it: it was held at some instant of each listing (between its Asked
// and T), so it began by the first listing's T (first) and lasted
// until at least the last listing's Asked (last). A listing can take
// up to its timeout, so its T alone would make a grant look longer.
type grantSpan struct{ first, last int64 }

// grantID is a grant's key, owner and fence. An acquisition that retries
// after its grant lapsed (its reply was lost, or came too late) asks
// again as the same owner and may be granted the key anew.
type grantID struct {
	key, owner string
	fence      uint64
}

// genAcq is one acquisition: the keys it was invoked on, when, and when
// it completed (0: never), and whether it failed.
type genAcq struct {
	name         string
	worker       int
	keys         []string
	invoke, done int64
	failed       bool
}

// genChecker gathers what CheckGen needs from a history, then judges it.
// It fills r as it goes.
type genChecker struct {
	r          GenReport
	strength   fenced.FenceStrength
	ttl, bound time.Duration
	end        int64 // the time of the history's last event

	invokes           map[opKey]int64 // when each operation asked for each key
	seenOp            map[int64]bool
	grants            []*genGrant     // in the order they were confirmed
	returned          map[string]bool // the owners some grant went to
	observed          map[grantID]*grantSpan
	acqs              map[int64]*genAcq
	holding           map[int]int // leases held, per worker
	faults            []faultWindow
	open              map[string]int // open faults' positions in faults
	renewedAfterBreak []Event
	// brokenAt is when each grant broken by a Break was reported broken
	// (the Break's completion).
	brokenAt map[grantID][]int64
	// piped is each worker process's last Piped count.
	piped map[int]int64
}

// newGenChecker returns a checker for events, sorted by time.
func newGenChecker(events []Event, strength fenced.FenceStrength, ttl, bound time.Duration) *genChecker {
	c := &genChecker{
		r:        GenReport{ByOp: map[string]int{}},
		strength: strength,
		ttl:      ttl,
		bound:    bound,
		invokes:  map[opKey]int64{},
		seenOp:   map[int64]bool{},
		returned: map[string]bool{},
		observed: map[grantID]*grantSpan{},
		acqs:     map[int64]*genAcq{},
		holding:  map[int]int{},
		open:     map[string]int{},
		brokenAt: map[grantID][]int64{},
		piped:    map[int]int64{},
	}
	if len(events) > 0 {
		c.r.start = events[0].T
		c.end = events[len(events)-1].T
	}
	return c
}

// record takes in one event of the history, in time order.
func (c *genChecker) record(e Event) {
	r := &c.r
	switch e.Kind {
	case AcquireInvoke, BreakInvoke:
		c.invoked(e)
	case ReleaseInvoke:
		c.holding[e.Worker]--
	case AcquireOK, SetMember:
		c.granted(e)
	case AcquireFail:
		r.Errors++
		if a := c.acqs[e.Op]; a != nil && a.done == 0 {
			a.done, a.failed = e.T, true
		}
	case LivePastValidity:
		r.LivePastValidity++
		r.MaxOvershoot = max(r.MaxOvershoot, time.Duration(e.Value))
		r.problem(e.T, "worker %d: lease on %s (fence %d) live %v past its local validity (%s)", e.Worker, e.Key, e.Fence,
			time.Duration(e.Value), e.Err)
	case RenewedAfterBreak:
		c.renewedAfterBreak = append(c.renewedAfterBreak, e)
	case Piped:
		c.piped[e.PID] = max(c.piped[e.PID], e.Value)
	case SetHealthyLost:
		r.SetsHealthyWithLost++
		r.problem(e.T, "worker %d: a set reported healthy while its lease on %s (fence %d) had ended: %s", e.Worker, e.Key, e.Fence, e.Err)
	case Observed:
		c.observe(e)
	case BreakDone:
		if e.Err == "" && e.Fence != 0 {
			k := grantID{e.Key, e.Owner, e.Fence}
			c.brokenAt[k] = append(c.brokenAt[k], e.T)
		}
	case FaultStart:
		r.Faults++
		c.open[fmt.Sprintf("%s/%d", e.Fault, e.Worker)] = len(c.faults)
		c.faults = append(c.faults, faultWindow{e.T, c.end, e.Worker, e.Fault})
	case FaultEnd:
		if i, ok := c.open[fmt.Sprintf("%s/%d", e.Fault, e.Worker)]; ok {
			c.faults[i].end = e.T
		}
	}
}

// invoked records an acquisition or break asking for one key.
func (c *genChecker) invoked(e Event) {
	c.invokes[opKey{e.Op, e.Key}] = e.T
	if e.Kind == AcquireInvoke {
		a := c.acqs[e.Op]
		if a == nil {
			a = &genAcq{name: e.Name, worker: e.Worker, invoke: e.T}
			c.acqs[e.Op] = a
		}
		a.keys = append(a.keys, e.Key)
	}
	if !c.seenOp[e.Op] {
		c.seenOp[e.Op] = true
		c.r.Ops++
		c.r.ByOp[e.Name]++
	}
}

// granted records a grant handed to a worker: a lease, or a set's member.
func (c *genChecker) granted(e Event) {
	c.holding[e.Worker]++
	c.r.MaxHeld = max(c.r.MaxHeld, c.holding[e.Worker])
	if a := c.acqs[e.Op]; a != nil && a.done == 0 {
		a.done = e.T
	}
	inv, known := c.invokes[opKey{e.Op, e.Key}]
	c.grants = append(c.grants,
		&genGrant{key: e.Key, owner: e.Owner, fence: e.Fence, invoke: inv, invokeKnown: known, ok: e.T, worker: e.Worker, op: e.Op,
			setMember: e.Kind == SetMember, setHealthy: e.Kind == SetMember && e.Value == 1, confirmed: e.Confirmed})
	c.returned[e.Owner] = true
}

// observe widens the span of a grant a listing saw held.
func (c *genChecker) observe(e Event) {
	if e.Owner == "" {
		return
	}
	k := grantID{e.Key, e.Owner, e.Fence}
	asked := e.T
	if e.Asked != 0 {
		asked = e.Asked
	}
	if s := c.observed[k]; s != nil {
		s.first, s.last = min(s.first, e.T), max(s.last, asked)
	} else {
		c.observed[k] = &grantSpan{e.T, asked}
	}
}

// checkFences checks the fences of each key, in the order its grants were
// confirmed.
func (c *genChecker) checkFences() {
	byKey := map[string][]*genGrant{}
	for _, g := range c.grants {
		byKey[g.key] = append(byKey[g.key], g)
	}
	for key, gs := range byKey {
		c.checkKeyFences(key, gs)
	}
}

// checkKeyFences checks key's grants gs, in confirmation (ok) order. A
// fence may go to one owner only, and never below one confirmed before.
func (c *genChecker) checkKeyFences(key string, gs []*genGrant) {
	r := &c.r
	prefixMax := make([]uint64, len(gs))
	var m uint64
	owners := map[uint64]string{}
	for i, g := range gs {
		m = max(m, g.fence)
		prefixMax[i] = m
		if o, ok := owners[g.fence]; ok && o != g.owner {
			if c.strength >= fenced.FenceStrict {
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
			if f := maxBefore(g.invoke); g.fence < f && c.strength >= fenced.FenceStrict {
				r.FenceRegressions++
				r.problem(g.ok, "%s: fence %d granted (worker %d) after fence %d was confirmed", key, g.fence, g.worker, f)
			}
		}
		if g.setHealthy {
			if f := maxBefore(g.ok - int64(setMargin)); f > g.fence && !c.brokenUnseen(g) {
				r.SetsHealthyWithLost++
				r.problem(g.ok,
					"%s: AcquireAll (worker %d, op %d) returned a healthy set whose lease (fence %d) was already superseded by fence %d",
					key, g.worker, g.op, g.fence, f)
			}
		}
	}
}

// brokenUnseen reports whether set member g's grant was broken by a Break
// that AcquireAll's confirmation could not have seen: one that completed
// after AcquireAll began to confirm g (g.confirmed, after its last key
// was granted), or any break of the last key's grant, which is confirmed
// by its grant alone. A break that completed before then was done before
// the confirming renewal was sent, which must then have been refused.
func (c *genChecker) brokenUnseen(g *genGrant) bool {
	for _, t := range c.brokenAt[grantID{g.key, g.owner, g.fence}] {
		if g.confirmed == 0 || t >= g.confirmed {
			return true
		}
	}
	return false
}

// checkRenewedAfterBreak counts the renewals after a worker's own break.
// A crash of an authority with a repeatable fence excuses one.
func (c *genChecker) checkRenewedAfterBreak() {
	for _, e := range c.renewedAfterBreak {
		// A restart of an authority that may lose data (its fence is
		// repeatable) may bring the broken key back.
		excused := false
		for _, f := range c.faults {
			if c.strength < fenced.FenceStrict && f.fault == string(CrashAuthority) && f.start <= e.T &&
				f.start >= e.T-int64(10*time.Second) {
				excused = true
			}
		}
		if !excused {
			c.r.RenewedAfterBreak++
			c.r.problem(e.T,
				"worker %d: its lease on %s (fence %d) was renewed by a request sent after the worker broke it "+
					"(validity %v past the break plus the TTL)", e.Worker, e.Key, e.Fence, time.Duration(e.Value).Round(time.Millisecond))
		}
	}
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
