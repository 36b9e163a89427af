package recipe

// ObserveEvery is how often Observe reads the election, for the tests.
const ObserveEvery = observeEvery

// AssignThrottled is assignPartitions, for the tests: weights, and the
// rebalancing knobs as given (all zero: no throttle).
func AssignThrottled(members []string, weight map[string]int, partitions int, current map[int]string,
	threshold, share float64, maxMoves int) map[string][]int {
	return assignPartitions(members, weight, partitions, current, rebalance{threshold, share, maxMoves})
}
