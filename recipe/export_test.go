package recipe

import (
	"context"

	"github.com/fenced-dev/fenced"
)

// ObserveEvery is how often Observe reads the election, for the tests.
const ObserveEvery = observeEvery

// AssignThrottled is assignPartitions, for the tests: weights, and the
// rebalancing knobs as given (all zero: no throttle).
func AssignThrottled(members []string, weight map[string]int, partitions int, current map[int]string,
	threshold, share float64, maxMoves int) map[string][]int {
	return assignPartitions(members, weight, partitions, current, rebalance{threshold, share, maxMoves})
}

// AssignPartitions is assignPartitions unweighted and unthrottled, for the
// tests.
func AssignPartitions(members []string, partitions int, current map[int]string) map[string][]int {
	return assignPartitions(members, nil, partitions, current, rebalance{})
}

// ReadCheckpoint is what a member reads when it takes partition lease l,
// for the tests.
func ReadCheckpoint(ctx context.Context, c *fenced.Client, l *fenced.Lease) ([]byte, error) {
	return (&Partitions{c: c}).readCheckpoint(ctx, l)
}
