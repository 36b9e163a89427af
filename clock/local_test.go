package clock

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// TestLocalStableWhenDescheduled converts one Real reading again and again
// while the converting goroutine is descheduled every 10ms (one P, shared
// with a goroutine that spins: Go preempts each after its 10ms slice, at
// any instruction), as a busy machine deschedules a process. Local used to
// read time.Now twice, and a goroutine descheduled between the two moved
// the converted time back by as long as it waited: a lease's ValidUntil
// seemed to move by milliseconds without a renewal, and the proof harness
// took it for one (TestSamplerSeesUnchangedValidity).
func TestLocalStableWhenDescheduled(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		for !stop.Load() {
		}
	}()
	defer func() { stop.Store(true); <-done }()

	// A converted reading may move only when the time suspended is read
	// again (once a second), by the spread of that read (tightRead, bar
	// four reads in a row descheduled); a descheduling is 10ms here.
	const tolerance = time.Millisecond
	c := Real()
	r := c.Now()
	first := Local(c, r)
	n, moved := 0, time.Duration(0)
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); n++ {
		if d := Local(c, r).Sub(first).Abs(); d > moved {
			moved = d
		}
	}
	if moved > tolerance {
		t.Fatalf("Local of one reading moved by up to %v over %d conversions, want at most %v", moved, n, tolerance)
	}
	t.Logf("%d conversions, moved by at most %v", n, moved)
}
