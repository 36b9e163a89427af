// Package recipetest is the part of the conformance suite that runs the
// recipes (package recipe) on a backend. Each backend's conformance test
// calls RunConformanceTests beside drivertest's, with the same Harness:
// the recipes are where a driver's subtler paths meet (an election's
// observer beside waiters, a semaphore's wait racing every slot).
package recipetest

import (
	"testing"

	"github.com/fenced-dev/fenced/drivertest"
)

// RunConformanceTests runs the recipes' tests as subtests of t, on the
// drivers h opens. It reads h.Open and h.MinFence.
func RunConformanceTests(t *testing.T, h drivertest.Harness) {
	s := &suite{h: h}
	t.Run("CancelledPermitAcquireLeavesNoGrant", s.testCancelledPermitAcquireLeavesNoGrant)
	t.Run("ObserverTakesNoWakeUp", s.testObserverTakesNoWakeUp)
}

type suite struct{ h drivertest.Harness }
