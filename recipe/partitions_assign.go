package recipe

import (
	"cmp"
	"hash/fnv"
	"math"
	"slices"
)

// rebalance throttles the voluntary moves of an assignment: partitions
// that a live owner must hand off to another member. Partitions that are
// free (never owned, released, or held by a member that is gone) are
// never throttled. The zero value throttles nothing.
type rebalance struct {
	// threshold: no voluntary move unless some member's count differs
	// from its target by more than threshold × its target (KCL's
	// reBalanceThresholdPercentage, as a fraction).
	threshold float64
	// share of a member's excess (count - target) it hands off at once,
	// rounded up (KCL's dampening); 0 means all of it.
	share float64
	// maxMoves bounds the voluntary moves in the whole plan, that is the
	// partitions in hand-off at once (Helix's maxPartitionInTransition);
	// 0 means no bound.
	maxMoves int
}

// assignPartitions returns which partitions of [0, partitions) each of
// members owns in a group. It is a map from member ID to its sorted
// partitions. current says who owns each partition now (partitions
// missing from it, or owned by someone not in members, are free). Nil
// means nobody does. Every member of the group computes it from the same
// listing of the authority (the live members and the partitions'
// holders). So they agree without talking to each other. The order of
// members does not matter.
//
// Counts are ⌊P/N⌋ or ⌈P/N⌉, so the balance is within one. An assignment
// computed from the previous one moves only what must move. On a join,
// only the ⌊P/N⌋ partitions the newcomer takes. On a leave or crash, only
// the leaver's. It works in three steps:
//
//  1. Capacities. The P mod N members that get ⌈P/N⌉ are those that hold
//     the most now (counted up to ⌈P/N⌉), ties going to the member with
//     the highest score of its own, so no member holding ⌈P/N⌉ is cut
//     to ⌊P/N⌋ while another is raised.
//  2. Keep. Every member keeps its current partitions up to its capacity.
//     One over its capacity sheds the surplus, first the partitions that
//     its fresh assignment (below) gives to others.
//  3. Fill. The free partitions go to the members below their capacity:
//     first each to its owner in the fresh assignment if that member has
//     room, then by rendezvous score.
//
// The fresh assignment is rendezvous (highest random weight) hashing with
// capacities. Every (partition, member) pair gets a pseudo-random score
// from the two names alone. Pairs are taken in decreasing score while the
// partition is free and the member below its capacity. It is the
// assignment of a group that starts with nothing owned. It is also the
// shape that steps 2 and 3 pull towards. So a member that restarts with
// the same ID gets its old partitions back (all of them when its share is
// ⌊P/N⌋).
//
// No assignment computed from the member set alone can do this. With a
// balance within one and arbitrary joins and leaves, some join or leave
// must move more than the newcomer's or leaver's share (docs/recipes.md
// shows why). That is why the current owners are an input.
//
// weight[id] (missing or below 1 meaning 1) weighs the members, and rb
// throttles the voluntary moves. With weights, the
// capacities are P·w/W rounded down, plus one for the P mod-rest members
// of the largest remainders (then those holding the most, as without
// weights). So each member's count is within one of its weighted share.
//
// Throttling keeps the plan a subset of the unthrottled one: the
// unthrottled plan is computed first, then some of its voluntary moves
// are held back (the partition stays with its owner). Each step of a
// group therefore moves a partition only where the unthrottled plan
// would, and once a step has no held-back move the group is at the
// unthrottled plan's balance (within the threshold).
func assignPartitions(members []string, weight map[string]int, partitions int, current map[int]string,
	rb rebalance) map[string][]int {
	members = slices.Clone(members)
	slices.Sort(members)
	members = slices.Compact(members)
	n := len(members)
	out := make(map[string][]int, n)
	if n == 0 || partitions <= 0 {
		return out
	}
	a := newAssigner(members, partitions, weight)
	fresh := a.assign(a.capacities(nil), allPartitions(partitions), nil)
	if len(current) == 0 {
		return a.result(fresh)
	}

	// 1. Capacities, from the current counts.
	owner := make([]int32, partitions) // member index, or -1 when free
	count := make([]int, n)
	index := make(map[string]int32, n)
	for i, m := range members {
		index[m] = int32(i)
	}
	for p := range owner {
		owner[p] = -1
		if id, ok := current[p]; ok {
			if m, ok := index[id]; ok {
				owner[p] = m
				count[m]++
			}
		}
	}
	capacity := a.capacities(count)
	target := slices.Clone(capacity)

	// 2. Keep up to the capacity: the fresh assignment's partitions
	// first, then by score. shed[m] is what m gives up, least wanted
	// first.
	held := make([][]int, n)
	for p, m := range owner {
		if m >= 0 {
			held[m] = append(held[m], p)
		}
	}
	var free []int
	for p, m := range owner {
		if m < 0 {
			free = append(free, p)
		}
	}
	result := make([]int32, partitions)
	for p := range result {
		result[p] = -1
	}
	shed := make([][]int, n)
	for m, ps := range held {
		if len(ps) > capacity[m] {
			slices.SortFunc(ps, func(x, y int) int {
				return cmp.Or(
					cmp.Compare(b2i(fresh[y] == int32(m)), b2i(fresh[x] == int32(m))),
					cmp.Compare(a.score(y, m), a.score(x, m)),
					cmp.Compare(x, y))
			})
			shed[m] = slices.Clone(ps[capacity[m]:])
			slices.Reverse(shed[m])
			free = append(free, ps[capacity[m]:]...)
			ps = ps[:capacity[m]]
		}
		for _, p := range ps {
			result[p] = int32(m)
		}
		capacity[m] -= len(ps)
	}
	slices.Sort(free)

	// 3. Fill: the fresh owner if it has room, then by score.
	var rest []int
	for _, p := range free {
		if m := fresh[p]; capacity[m] > 0 {
			result[p] = m
			capacity[m]--
			continue
		}
		rest = append(rest, p)
	}
	a.assign(capacity, rest, result)
	if rb != (rebalance{}) {
		a.throttle(rb, result, owner, target, shed)
	}
	return a.result(result)
}

// throttle holds back some of the voluntary moves of plan (the shed
// partitions, which plan gives to others) by giving them back to their
// owners: all of them while every member is within the threshold of its
// target, else all but the first ⌈share × excess⌉ of each member's, and
// of those all but the first maxMoves, taken round-robin over the
// members. The order is stable while the owners do not change, so a
// member that looks again in the middle of a hand-off chooses the same
// partitions.
func (a *assigner) throttle(rb rebalance, plan, owner []int32, target []int, shed [][]int) {
	// The counts after the free partitions are filled and before any
	// move: the owners keep their shed partitions.
	count := make([]int, len(a.members))
	for _, m := range plan {
		if m >= 0 {
			count[m]++
		}
	}
	for m, ps := range shed {
		count[m] += len(ps)
		for _, p := range ps {
			count[plan[p]]--
		}
	}
	outside := false
	for m, c := range count {
		if math.Abs(float64(c-target[m])) > rb.threshold*float64(target[m]) {
			outside = true
		}
	}
	type move struct{ rank, m, p int }
	var moves []move
	for m, ps := range shed {
		allowed := 0
		if outside {
			allowed = len(ps)
			if rb.share > 0 {
				allowed = min(allowed, int(math.Ceil(rb.share*float64(len(ps))-1e-9)))
			}
		}
		for i, p := range ps {
			if i < allowed {
				moves = append(moves, move{i, m, p})
				continue
			}
			plan[p] = owner[p]
		}
	}
	if rb.maxMoves <= 0 || len(moves) <= rb.maxMoves {
		return
	}
	slices.SortFunc(moves, func(x, y move) int { return cmp.Or(cmp.Compare(x.rank, y.rank), cmp.Compare(x.m, y.m)) })
	for _, mv := range moves[rb.maxMoves:] {
		plan[mv.p] = owner[mv.p]
	}
}

// assigner holds the members' hashes for one computation.
type assigner struct {
	members    []string
	partitions int
	hashes     []uint64
	weights    []int // each at least 1
}

func newAssigner(members []string, partitions int, weight map[string]int) *assigner {
	a := &assigner{members: members, partitions: partitions, hashes: make([]uint64, len(members)),
		weights: make([]int, len(members))}
	for i, m := range members {
		a.hashes[i] = nameHash(m)
		a.weights[i] = max(1, weight[m])
	}
	return a
}

// score is the rendezvous score of partition p for member m.
func (a *assigner) score(p, m int) uint64 {
	return mix(a.hashes[m] ^ mix(uint64(p)+0x9e3779b97f4a7c15))
}

// capacities returns each member's capacity: ⌊P·w/W⌋ (⌊P/N⌋ when the
// weights are equal), plus one for the members ranked first by the
// remainder of P·w/W, then by min(count, that floor + 1) less the floor
// (nil count: all zero), then by the member's own score, then by ID.
func (a *assigner) capacities(count []int) []int {
	n := len(a.members)
	total := 0
	for _, w := range a.weights {
		total += w
	}
	floor := make([]int, n)
	rem := make([]int, n)
	left := a.partitions
	for m, w := range a.weights {
		floor[m], rem[m] = a.partitions*w/total, a.partitions*w%total
		left -= floor[m]
	}
	rank := make([]int, n)
	for i := range rank {
		rank[i] = i
	}
	held := func(m int) int {
		if count == nil {
			return 0
		}
		return min(count[m], floor[m]+1) - floor[m]
	}
	slices.SortFunc(rank, func(x, y int) int {
		return cmp.Or(cmp.Compare(rem[y], rem[x]),
			cmp.Compare(held(y), held(x)),
			cmp.Compare(mix(a.hashes[y]), mix(a.hashes[x])),
			cmp.Compare(a.members[x], a.members[y]))
	})
	capacity := make([]int, n)
	for i, m := range rank {
		capacity[m] = floor[m]
		if i < left {
			capacity[m]++
		}
	}
	return capacity
}

// assign gives each of free to a member, taking (partition, member)
// pairs in decreasing score while the partition is unassigned and the
// member has capacity left (it consumes capacity). It fills into (a new
// slice when into is nil, every partition -1 first) and returns it.
func (a *assigner) assign(capacity []int, free []int, into []int32) []int32 {
	if into == nil {
		into = make([]int32, a.partitions)
		for p := range into {
			into[p] = -1
		}
	}
	type pair struct {
		score uint64
		p, m  int32
	}
	var pairs []pair
	for _, p := range free {
		for m := range a.members {
			if capacity[m] > 0 {
				pairs = append(pairs, pair{a.score(p, m), int32(p), int32(m)})
			}
		}
	}
	slices.SortFunc(pairs, func(x, y pair) int {
		return cmp.Or(cmp.Compare(y.score, x.score), cmp.Compare(x.p, y.p), cmp.Compare(x.m, y.m))
	})
	left := len(free)
	for _, pr := range pairs {
		if left == 0 {
			break
		}
		if into[pr.p] >= 0 || capacity[pr.m] == 0 {
			continue
		}
		into[pr.p] = pr.m
		capacity[pr.m]--
		left--
	}
	return into
}

// result turns an owner per partition into the map assignPartitions
// returns.
func (a *assigner) result(owner []int32) map[string][]int {
	out := make(map[string][]int, len(a.members))
	for p, m := range owner {
		if m >= 0 {
			id := a.members[m]
			out[id] = append(out[id], p) // p ascending: sorted
		}
	}
	return out
}

func allPartitions(n int) []int {
	ps := make([]int, n)
	for i := range ps {
		ps[i] = i
	}
	return ps
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// nameHash is FNV-1a of s.
func nameHash(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

// mix is the SplitMix64 finalizer: it spreads every input bit over the
// output, so scores of related names are unrelated.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
