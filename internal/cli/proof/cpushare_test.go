package proof

import (
	"testing"
	"time"
)

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

// TestCPUMeterRecent: recent follows the last recentBursts measurements
// only, while share keeps the whole run; a worker's allowance for a late
// lease end grows as its recent share shrinks, up to 20 × Grace.
func TestCPUMeterRecent(t *testing.T) {
	w := &genWorker{cfg: GenWorkerConfig{Grace: 100 * time.Millisecond}}
	if a, s := w.allowance(); a != 100*time.Millisecond || s != 1 {
		t.Fatalf("allowance before any measurement = %v at share %v, want Grace at 1", a, s)
	}
	for range recentBursts {
		w.cpu.add(time.Millisecond, 10*time.Millisecond) // starved: 0.1
	}
	if s := w.cpu.recent(); s != 0.1 {
		t.Fatalf("recent share after starved bursts = %v, want 0.1", s)
	}
	if a, _ := w.allowance(); a != time.Second {
		t.Errorf("allowance at a share of 0.1 = %v, want 1s", a)
	}
	for range recentBursts {
		w.cpu.add(time.Millisecond, time.Millisecond)
	}
	if s := w.cpu.recent(); s != 1 {
		t.Errorf("recent share after the starved bursts left the window = %v, want 1", s)
	}
	if s := w.cpu.share(); s >= 0.2 || s <= 0.15 {
		t.Errorf("whole-run share = %v, want 20/110", s)
	}
	w.cpu = cpuMeter{}
	w.cpu.add(time.Millisecond, time.Second)
	if a, _ := w.allowance(); a != 2*time.Second {
		t.Errorf("allowance at a share of 0.001 = %v, want the cap of 20 × Grace", a)
	}
}
