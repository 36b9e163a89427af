package proof

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// TestCPUMeterSeesCompetition runs the meter on one P shared with three
// goroutines that spin: the meter's thread runs about a quarter of the
// time, and the share must say so (below 0.75 whatever else the machine
// runs; a meter that always said 1 would let a starved run prove less).
func TestCPUMeterSeesCompetition(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var stop atomic.Bool
	for range 3 {
		go func() {
			for !stop.Load() {
			}
		}()
	}
	defer stop.Store(true)
	var m cpuMeter
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	m.run(ctx)
	s := m.share()
	t.Logf("share %.2f", s)
	if s >= 0.75 {
		t.Fatalf("share %.2f with three goroutines spinning on the meter's one P, want about 0.25", s)
	}
	if got := MinOpsAt(1000, 0.25); got != 250 {
		t.Fatalf("MinOpsAt(1000, 0.25) = %d, want 250", got)
	}
	if got := MinOpsAt(1000, 1.5); got != 1000 {
		t.Fatalf("MinOpsAt(1000, 1.5) = %d, want 1000", got)
	}
}
