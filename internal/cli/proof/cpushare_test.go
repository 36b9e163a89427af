package proof

import "testing"

// TestMinOpsAt checks how a run's floor of operations scales with the
// share of a CPU it measured. (How well cpuMeter sees competition is not
// tested here: its 2ms burst fits in one scheduler slice more often than
// not, so with few competitors it reads near 1, which keeps the floor at
// its strictest; a test of it flaked on a quiet machine.)
func TestMinOpsAt(t *testing.T) {
	if got := MinOpsAt(1000, 0.25); got != 250 {
		t.Fatalf("MinOpsAt(1000, 0.25) = %d, want 250", got)
	}
	if got := MinOpsAt(1000, 1.5); got != 1000 {
		t.Fatalf("MinOpsAt(1000, 1.5) = %d, want 1000", got)
	}
	var m cpuMeter
	if s := m.share(); s != 1 {
		t.Fatalf("share before any measurement = %v, want 1", s)
	}
}
