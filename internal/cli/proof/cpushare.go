package proof

import (
	"cmp"
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
// 2% of a core. A burst that took longer than the period was stopped, not
// starved, and is left out.
type cpuMeter struct {
	// every and burst override the 100ms and 2ms of a run's meter.
	every, burst time.Duration

	mu        sync.Mutex
	cpu, wall time.Duration
	// last holds the most recent measurements, for recent.
	last [recentBursts]struct{ cpu, wall time.Duration }
	n    int
}

// recentBursts is how many measurements recent looks back over.
const recentBursts = 10

// run measures until ctx ends.
func (m *cpuMeter) run(ctx context.Context) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	burst, every := cmp.Or(m.burst, 2*time.Millisecond), cmp.Or(m.every, 100*time.Millisecond)
	t := time.NewTicker(every)
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
		// A burst longer than the period between bursts was most likely
		// stopped (SIGSTOP), not starved: it is no share the scheduler
		// gave, and it would excuse a stopped worker's late lease ends
		// (which the sampler judges from the resumption) for seconds.
		if wall := time.Since(start); wall <= every {
			m.add(c-c0, wall)
		}
	}
}

// add counts one measurement: cpu time run in wall time.
func (m *cpuMeter) add(cpu, wall time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cpu += cpu
	m.wall += wall
	m.last[m.n%recentBursts].cpu, m.last[m.n%recentBursts].wall = cpu, wall
	m.n++
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

// recent returns the share of a CPU over the last recentBursts
// measurements (1 before the first).
func (m *cpuMeter) recent() float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	var cpu, wall time.Duration
	for _, b := range m.last[:min(m.n, recentBursts)] {
		cpu, wall = cpu+b.cpu, wall+b.wall
	}
	if wall <= 0 {
		return 1
	}
	return min(1, float64(cpu)/float64(wall))
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
