package recipe

import (
	"cmp"
	"hash/fnv"
	"slices"
)

// AssignPartitions returns which partitions of [0, partitions) each of
// members owns in a group: a map from member ID to its sorted partitions.
// Every member of the group computes it from the same sorted list of live
// members, so they agree without talking to each other.
//
// It is rendezvous (highest random weight) hashing with capacities: every
// (partition, member) pair gets a pseudo-random score from the two names
// alone, and pairs are taken in decreasing score while the partition is
// unassigned and the member below its capacity. Capacities are
// ⌊P/N⌋ or ⌈P/N⌉, so the balance is within one. Scores do not depend on
// the other members, so a join or leave moves about P/N partitions, not
// P: a partition moves only when its winner changes or a capacity is
// reached earlier or later. A member that restarts with the same ID gets
// the same partitions back (stickiness).
func AssignPartitions(members []string, partitions int) map[string][]int {
	out := make(map[string][]int, len(members))
	members = slices.Clone(members)
	slices.Sort(members)
	members = slices.Compact(members)
	n := len(members)
	if n == 0 || partitions <= 0 {
		return out
	}
	// Which members get the ⌈P/N⌉ capacities: the P mod N with the
	// highest score of their own, so the choice too is stable.
	type ranked struct {
		id    string
		score uint64
	}
	byScore := make([]ranked, n)
	hashes := make([]uint64, n)
	for i, m := range members {
		hashes[i] = nameHash(m)
		byScore[i] = ranked{m, mix(hashes[i])}
	}
	slices.SortFunc(byScore, func(a, b ranked) int {
		return cmp.Or(cmp.Compare(b.score, a.score), cmp.Compare(a.id, b.id))
	})
	capacity := make(map[string]int, n)
	for i, r := range byScore {
		capacity[r.id] = partitions / n
		if i < partitions%n {
			capacity[r.id]++
		}
	}
	type pair struct {
		score uint64
		p     int32
		m     int32
	}
	pairs := make([]pair, 0, partitions*n)
	for p := range partitions {
		hp := mix(uint64(p) + 0x9e3779b97f4a7c15)
		for m := range n {
			pairs = append(pairs, pair{mix(hashes[m] ^ hp), int32(p), int32(m)})
		}
	}
	slices.SortFunc(pairs, func(a, b pair) int {
		return cmp.Or(cmp.Compare(b.score, a.score), cmp.Compare(a.p, b.p), cmp.Compare(a.m, b.m))
	})
	taken := make([]bool, partitions)
	left := partitions
	for _, pr := range pairs {
		id := members[pr.m]
		if taken[pr.p] || capacity[id] == 0 {
			continue
		}
		taken[pr.p] = true
		capacity[id]--
		out[id] = append(out[id], int(pr.p))
		if left--; left == 0 {
			break
		}
	}
	for id := range out {
		slices.Sort(out[id])
	}
	return out
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
