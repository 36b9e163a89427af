package recipe

import (
	"strconv"
	"strings"
)

// Defaults of the rebalancing knobs (PartitionsOptions). Measured by
// TestPartitionsThrottledJoinTime (docs/recipes.md has the figures).
const (
	// defaultThreshold is KCL 3.x's: a member within 10 % of its share
	// is not worth a move.
	defaultThreshold = 0.1
	// defaultDampening is KCL 3.x's 80 %: most of an excess moves in the
	// first wave, and the rest once those hand-offs ended.
	defaultDampening = 0.8
	// defaultInTransition is the divisor of P for MaxInTransition: at
	// most a quarter of the group is in hand-off at once.
	defaultInTransition = 4
)

// rebalance validates the rebalancing knobs of o for a group of
// partitions partitions and returns them, defaults filled in. The error
// names the field at fault.
func (o *PartitionsOptions) rebalance(group string, partitions int) (rebalance, error) {
	if o.Weight < 0 || o.Weight > maxWeight {
		return rebalance{}, invalidArg(group, "Weight %d is not 1 to %d (0 means 1)", o.Weight, maxWeight)
	}
	t, d, k := o.RebalanceThreshold, o.Dampening, o.MaxInTransition
	if !(t >= 0 && t < 1) {
		return rebalance{}, invalidArg(group, "RebalanceThreshold %v is not in [0, 1) (0 means %v)", t, defaultThreshold)
	}
	if !(d >= 0 && d <= 1) {
		return rebalance{}, invalidArg(group, "Dampening %v is not in (0, 1] (0 means %v)", d, defaultDampening)
	}
	if k < 0 {
		return rebalance{}, invalidArg(group, "MaxInTransition %d is negative (0 means ⌈P/%d⌉)", k, defaultInTransition)
	}
	if t == 0 {
		t = defaultThreshold
	}
	if d == 0 {
		d = defaultDampening
	}
	if k == 0 {
		k = (partitions + defaultInTransition - 1) / defaultInTransition
	}
	return rebalance{threshold: t, share: d, maxMoves: k}, nil
}

// weightTag is the owner tag of a membership lease of weight w: "w",
// the decimal weight and "x", which no hex digit of the owner's random
// part that follows can be mistaken for.
func weightTag(w int) string { return "w" + strconv.Itoa(w) + "x" }

// parseWeightTag reads the weight of a membership lease's owner: 1 if
// it has no weight tag (a member of an earlier release) or a bad one.
func parseWeightTag(owner string) int {
	s, ok := strings.CutPrefix(owner, "w")
	if !ok {
		return 1
	}
	digits, _, ok := strings.Cut(s, "x")
	if !ok {
		return 1
	}
	w, isNum := number(digits)
	if !isNum || w < 1 || w > maxWeight {
		return 1
	}
	return w
}

// weights returns the weights of the live members of partition count p,
// with self's weight w (a member's own membership may lag in the
// listing).
func (s GroupState) weights(p int, self string, w int) map[string]int {
	out := map[string]int{self: w}
	for _, m := range s.Members {
		if m.Partitions == p && m.ID != self {
			out[m.ID] = max(1, m.Weight)
		}
	}
	return out
}

// Targets returns the assignment the live members of the group's count
// (Partitions) move towards, from the current owners, with no throttle:
// each member holds within one of P·Weight/ΣWeight, and a join or leave
// moves only the newcomer's or leaver's share. Members hand off towards
// it at the pace their RebalanceThreshold, Dampening and MaxInTransition
// allow, and stop within the threshold of it.
func (s GroupState) Targets() map[string][]int {
	p := s.Partitions()
	weight := map[string]int{}
	for _, m := range s.Members {
		if m.Partitions == p {
			weight[m.ID] = m.Weight
		}
	}
	return assignPartitions(s.memberIDs(p), weight, p, s.Owners, rebalance{})
}
