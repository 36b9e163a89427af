package clock

import (
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// bootStart is CLOCK_BOOTTIME when the process started (with start), and
// bootClock whether it could be read: where it cannot (a sandbox without
// it), the clock falls back to package time's monotonic clock.
var bootStart, bootClock = bootTime()

func bootTime() (time.Duration, bool) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0, false
	}
	return time.Duration(ts.Nano()), true
}

// suspendedReading is the time the machine had spent suspended since the
// process started (CLOCK_BOOTTIME's advance minus the monotonic clock's),
// when the monotonic clock read mono and the wall clock was drift ahead of
// it.
type suspendedReading struct {
	d, mono, drift time.Duration
}

var lastSuspended atomic.Pointer[suspendedReading]

// suspendedSince returns the time the machine has spent suspended since
// the process started (CLOCK_BOOTTIME's advance minus the monotonic
// clock's), as of now, a reading of time.Now.
//
// Reading CLOCK_BOOTTIME is a system call (a microsecond; time.Now is
// twenty times cheaper), so it is read again only when the time suspended
// may have changed: when the wall clock moved against the monotonic clock
// by more than a millisecond (a suspend moves the one and not the other),
// and at least once a second. In between, every caller gets the same value,
// so readings converted with it (Local) do not move.
func suspendedSince(now time.Time) time.Duration {
	mono := now.Sub(start)
	if !bootClock {
		return 0
	}
	drift := now.Round(0).Sub(start.Round(0)) - mono
	if s := lastSuspended.Load(); s != nil && mono-s.mono < time.Second && (drift-s.drift).Abs() < time.Millisecond {
		return s.d
	}
	s := &suspendedReading{d: readSuspended(), mono: mono, drift: drift}
	lastSuspended.Store(s)
	return s.d
}

// tightRead is how far apart the monotonic readings around a read of
// CLOCK_BOOTTIME may be for readSuspended to take it at once.
const tightRead = 50 * time.Microsecond

// readSuspended reads the time suspended: CLOCK_BOOTTIME between two
// readings of the monotonic clock. A process descheduled between them
// (a busy machine) would take the time it waited for time suspended, and
// every reading converted with it would move by that much; so it reads
// again, up to four times, and keeps the read with the closest pair.
// The first monotonic reading counts: the boot clock's, later, can only
// make the time suspended look longer, and validity shorter.
func readSuspended() time.Duration {
	var best, width time.Duration = 0, -1
	for range 4 {
		before := time.Now()
		bt, _ := bootTime()
		w := time.Since(before)
		if width < 0 || w < width {
			best, width = max(bt-bootStart-before.Sub(start), 0), w
		}
		if width <= tightRead {
			break
		}
	}
	return best
}
