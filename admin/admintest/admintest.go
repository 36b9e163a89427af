// Package admintest is the part of the conformance suite that runs the
// operator's side (package admin) on a backend. Each backend's conformance
// test calls RunConformanceTests beside drivertest's, with the same Harness.
package admintest

import (
	"testing"

	"github.com/fenced-dev/fenced/drivertest"
)

// RunConformanceTests runs admin's tests as subtests of t, on the drivers
// h opens. It reads h.Open and h.MinFence.
func RunConformanceTests(t *testing.T, h drivertest.Harness) {
	s := &suite{h: h}
	t.Run("ListInspectBreak", s.testListInspectBreak)
}

type suite struct{ h drivertest.Harness }
