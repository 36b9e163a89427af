package proof

import (
	"context"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// cpuMeter measures the share of a CPU that a runnable thread of this
// process gets: every 100ms it spins until its thread has run for 2ms and
// times how long that took. On an idle core the share is 1; on a machine
// busy with other work it is what the scheduler hands each runnable
// process (two cores, ten runnable processes: about 0.2), and the workers
// of a run, which compete for the same cores, get about as much. It costs
// 2% of a core.
type cpuMeter struct {
	mu        sync.Mutex
	cpu, wall time.Duration
}

// run measures until ctx ends.
func (m *cpuMeter) run(ctx context.Context) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	const burst = 2 * time.Millisecond
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		start := time.Now()
		c0, ok := threadCPU()
		c := c0
		for ok && c-c0 < burst {
			c, ok = threadCPU()
		}
		if !ok {
			return // no thread CPU clock: the share stays 1
		}
		wall := time.Since(start)
		m.mu.Lock()
		m.cpu += c - c0
		m.wall += wall
		m.mu.Unlock()
	}
}

// share returns the share of a CPU measured so far (1 before the first
// measurement).
func (m *cpuMeter) share() float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.wall <= 0 {
		return 1
	}
	return min(1, float64(m.cpu)/float64(m.wall))
}

// threadCPU returns the CPU time the calling thread has used, and whether
// it could be read.
func threadCPU() (time.Duration, bool) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0, false
	}
	return time.Duration(ts.Nano()), true
}
