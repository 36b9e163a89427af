package proof

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"time"
)

// GenPartReport is the checked outcome of a partitions run
// (RunGenPartitions).
type GenPartReport struct {
	Seed     uint64
	Duration time.Duration
	// Faults counts the nemesis's faults by kind (kill, stop, leave,
	// deploy); Exits the members that stopped by themselves, by exit code
	// (3: ErrPartitionCount, 4: ErrMemberLive, others are failures).
	Faults map[string]int
	Exits  map[int]int
	// Ownerships counts partition grants whose work ran; Counts the
	// partition counts they were taken with.
	Ownerships int
	Counts     []int
	// WritesAccepted counts the resource's accepted writes, WritesRefused
	// those the guard refused.
	WritesAccepted, WritesRefused int
	// Overlaps counts pairs of ownerships live at the authority at once
	// (see CheckGenPartitions) that cover a common item: an item worked by
	// two members at once. Must be 0.
	Overlaps int
	// StaleAccepted counts accepted writes whose fence is below one the
	// partition's row had accepted before (or equal to it, from another
	// process). Must be 0.
	StaleAccepted int
	// CheckpointsAccepted and CheckpointsRefused count the partitions'
	// checkpoint tries the store accepted and refused (ErrNotHeld);
	// CheckpointStarts the ownerships that started from a checkpoint.
	CheckpointsAccepted, CheckpointsRefused, CheckpointStarts int
	// StaleCheckpoints counts checkpoints accepted under a fence after a
	// later grant of the partition had started its work; CheckpointBreaks
	// the ownerships that did not start from the last checkpoint accepted
	// before them (see checkCheckpoints). Both must be 0.
	StaleCheckpoints, CheckpointBreaks int
	// LateItemWrites counts accepted writes of an item by an ownership
	// after another ownership had written that item: the per-partition
	// guard cannot refuse them when the new owner works the item under
	// another partition key (another count). Reported, see docs/proof.md.
	LateItemWrites int
	// FirstLateItemWrite describes the first late item write.
	FirstLateItemWrite string
	// LongestUnowned is the longest a partition of the live members'
	// count went without a lease while one was live, as the observer's
	// listings saw it; Bound what it must stay under, Spells how many
	// spells there were, MaxSchedDelay the measured scheduling delay the
	// bound is derived from.
	LongestUnowned, Bound, MaxSchedDelay time.Duration
	Spells, Listings                     int
	// Knobs are the run's rebalancing settings and the members' weights;
	// Converge how long after the last fault the group was balanced by
	// weight within the threshold, ConvergeBound what it must stay under
	// (judgeConvergence).
	Knobs                   string
	Converge, ConvergeBound time.Duration
	// Problems describes each violation; FirstViolation is how far into
	// the run the first one happened. Missed counts those that are time
	// bounds (recovery, convergence); the rest are safety checks.
	Problems       []string
	FirstViolation time.Duration
	Missed         int
}

// Failed reports whether any check failed.
func (r GenPartReport) Failed() bool { return len(r.Problems) > 0 }

// ownership is one partition grant as the member worked it.
type ownership struct {
	pid         int64
	slot        int
	member      string
	p, part     int
	fence       uint64
	start, live int64 // certainly held at the authority over [start, live]
}

func (o *ownership) String() string {
	return fmt.Sprintf("%s (pid %d) partition %d of %d, fence %d", o.member, o.pid, o.part, o.p, o.fence)
}

type ownKey struct {
	pid   int64
	part  int
	fence uint64
}

// CheckGenPartitions judges a partitions run from its members' history
// and the resource's accepted writes (in commit order), items being
// routed by itemPartition:
//
//   - no item worked by two members at once: an ownership is certainly
//     held at the authority from the start of its work (the grant came
//     before) to the last instant its member saw the lease's local
//     validity reach past now with its context live (validity ends before
//     the authority's grant; the context before the release). Two
//     ownerships whose such intervals intersect and whose partitions share
//     an item (same key, or hash mod P₁ = p₁ and hash mod P₂ = p₂) are an
//     overlap. The intervals are read on one CLOCK_MONOTONIC, so no
//     tolerance is needed;
//   - no stale write accepted: on each partition's row, the accepted
//     fences never go down (nor repeat from another process);
//   - the checkpoints: none accepted from a stale grant, and every grant
//     starts from the last one accepted before it (checkCheckpoints).
func CheckGenPartitions(events []partEvent, writes []partWrite, items int) GenPartReport {
	c := &partChecker{
		items:      items,
		violations: violations{first: -1, since: "run"},
		owns:       map[ownKey]*ownership{},
		counts:     map[int]bool{},
		route:      map[[2]int][]bool{},
	}
	c.problems = &c.rep.Problems
	for _, e := range events {
		if c.t0 == 0 || e.T < c.t0 {
			c.t0 = e.T
		}
	}
	c.collect(events)
	c.checkWrites(writes)
	c.countLateItemWrites(writes)
	c.checkOverlaps()
	c.checkCheckpoints(events)
	if c.first >= 0 {
		c.rep.FirstViolation = time.Duration(c.first - c.t0)
	}
	return c.rep
}

// partChecker holds what CheckGenPartitions has learnt of a run.
// It fills rep as it goes.
type partChecker struct {
	rep   GenPartReport
	items int
	violations
	owns   map[ownKey]*ownership
	counts map[int]bool // the partition counts seen
	// route holds which items each (count, partition) covers.
	route map[[2]int][]bool
}

// own returns the ownership k, making it on first use.
func (c *partChecker) own(k ownKey) *ownership {
	o := c.owns[k]
	if o == nil {
		o = &ownership{pid: k.pid, part: k.part, fence: k.fence}
		c.owns[k] = o
	}
	return o
}

// collect gathers the ownerships from the members' history.
func (c *partChecker) collect(events []partEvent) {
	for _, e := range events {
		if e.K != "own" && e.K != "end" {
			continue
		}
		o := c.own(ownKey{int64(e.PID), e.Part, e.Fence})
		o.slot, o.member, o.p = e.Slot, e.Member, e.P
		c.counts[e.P] = true
		switch e.K {
		case "own":
			o.start = e.T
		case "end":
			o.live = max(o.live, e.Live)
			c.rep.WritesRefused += e.Refused
		}
	}
}

// checkWrites widens the ownerships by their accepted writes, and checks
// that each partition row's fences never go down.
func (c *partChecker) checkWrites(writes []partWrite) {
	// A killed member logs no end: its accepted writes made while it saw
	// the lease live give the instants it certainly held it.
	lastFence := map[int]partWrite{}
	for _, w := range writes {
		c.rep.WritesAccepted++
		o := c.own(ownKey{w.PID, w.Part, w.Fence})
		if o.p == 0 {
			o.member, o.p = w.Member, w.P
		}
		if o.start == 0 || w.T < o.start {
			o.start = w.T
		}
		if w.Live {
			o.live = max(o.live, w.T)
		}
		if prev, ok := lastFence[w.Part]; ok && (w.Fence < prev.Fence || w.Fence == prev.Fence && w.PID != prev.PID) {
			c.rep.StaleAccepted++
			c.violation(w.T,
				"stale write accepted on partition row %d: fence %d by %s (pid %d, count %d) after fence %d by %s (pid %d, count %d)",
				w.Part, w.Fence, w.Member, w.PID, w.P, prev.Fence, prev.Member, prev.PID, prev.P)
		}
		if prev, ok := lastFence[w.Part]; !ok || w.Fence >= prev.Fence {
			lastFence[w.Part] = w
		}
	}
}

// countLateItemWrites counts, per item, an ownership that writes again
// after another ownership wrote the item. The later ownership stays the
// item's owner: its own next writes are not late.
func (c *partChecker) countLateItemWrites(writes []partWrite) {
	rep := &c.rep
	lastOwner := map[int]ownKey{}
	superseded := map[int]map[ownKey]bool{}
	for _, w := range writes {
		k := ownKey{w.PID, w.Part, w.Fence}
		if superseded[w.Item][k] {
			rep.LateItemWrites++
			if rep.LateItemWrites == 1 {
				rep.FirstLateItemWrite = fmt.Sprintf("item %d written by %s (pid %d, partition %d of %d, fence %d, its lease seen live: "+
					"%t) after another member's write of it",
					w.Item, w.Member, w.PID, w.Part, w.P, w.Fence, w.Live)
			}
			continue
		}
		if prev, ok := lastOwner[w.Item]; ok && prev != k {
			if superseded[w.Item] == nil {
				superseded[w.Item] = map[ownKey]bool{}
			}
			superseded[w.Item][prev] = true
		}
		lastOwner[w.Item] = k
	}
}

// covers returns which items partition part of p covers.
func (c *partChecker) covers(p, part int) []bool {
	cv, ok := c.route[[2]int{p, part}]
	if !ok {
		cv = make([]bool, c.items)
		for i := range c.items {
			cv[i] = itemPartition(i, p) == part
		}
		c.route[[2]int{p, part}] = cv
	}
	return cv
}

// checkOverlaps checks that no two ownerships held at once share an item.
// It also counts the ownerships and lists the partition counts seen.
func (c *partChecker) checkOverlaps() {
	var list []*ownership
	for _, o := range c.owns {
		if o.start > 0 && o.live >= o.start {
			list = append(list, o)
		}
	}
	c.rep.Ownerships = len(c.owns)
	for p := range c.counts {
		c.rep.Counts = append(c.rep.Counts, p)
	}
	slices.Sort(c.rep.Counts)
	slices.SortFunc(list, func(a, b *ownership) int { return int(a.start - b.start) })
	for i, a := range list {
		for _, b := range list[i+1:] {
			if b.start > a.live {
				break
			}
			c.checkPair(a, b)
		}
	}
}

// checkPair checks ownerships a and b, b starting before a's end.
func (c *partChecker) checkPair(a, b *ownership) {
	from, to := b.start, min(a.live, b.live)
	if to < from {
		return
	}
	if a.p == b.p && a.part != b.part {
		return
	}
	ca, cb := c.covers(a.p, a.part), c.covers(b.p, b.part)
	item := -1
	for x := range c.items {
		if ca[x] && cb[x] {
			item = x
			break
		}
	}
	if item < 0 && a.part != b.part {
		return
	}
	c.rep.Overlaps++
	c.violation(from, "item %d worked by two members at once for %v: %s and %s were both held at the authority",
		item, time.Duration(to-from).Round(time.Millisecond), a, b)
}

// judgeRecovery checks the longest unowned spell the observer saw against
// its bound. A spell starts when a partition's lease ends: released (a
// hand-off or a leave: the member that takes it is woken at once), or
// expired behind a member killed or stopped. In that case the others
// take it once the gone member's membership has ended too, which the
// store keeps at most outlives after its last renewal, and which was
// renewed at most a renewal period (TTL/3) after the partition lease;
// their next look comes within a poll (TTL/3); the listing that sees the
// new grant within two observer periods (200ms); the member's wake-up,
// its try and the observer's listing each wait at most the longest
// scheduling delay measured during the run; and the try and the listing
// that sees it each take at most the longest listing measured (a store
// round trip, slow on a loaded machine). stall is how long the store may
// be stalled by a stopped member (the longest stop, on a SQLite store),
// added to the bound.
func (r *GenPartReport) judgeRecovery(o *partObserver, outlives, ttl, stall time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	r.LongestUnowned, r.Spells, r.Listings, r.MaxSchedDelay = o.longest, o.spells, o.list, o.maxDelay
	r.Bound = outlives + ttl/3 + ttl/3 + 200*time.Millisecond + 3*o.maxDelay + 2*o.maxList + stall
	if o.longest > r.Bound {
		r.Missed++
		r.Problems = append(r.Problems,
			fmt.Sprintf("partition %d went without an owner for %v while a member of its count was live "+
				"(bound %v = the store's keep of a %v grant %v + a renewal period %v + a poll %v + 200ms of listing + 3 × the measured "+
				"scheduling delay %v + 2 × the longest listing %v + a store stall by a stopped member %v)",
				o.longestPart, o.longest.Round(time.Millisecond), r.Bound.Round(time.Millisecond), ttl, outlives, ttl/3, ttl/3,
				o.maxDelay.Round(time.Millisecond), o.maxList.Round(time.Millisecond), stall.Round(time.Millisecond)))
	}
}

// readPartHistory reads a partitions run's history.
func readPartHistory(path string) ([]partEvent, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("proof: read history: %w", err)
	}
	defer f.Close()
	var evs []partEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		var e partEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("proof: history %s line %d: %w", path, n, err)
		}
		evs = append(evs, e)
	}
	return evs, sc.Err()
}
