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

// suspended is the time the machine had spent suspended since the process
// started (CLOCK_BOOTTIME's advance minus the monotonic clock's), when the
// monotonic clock read mono and the wall clock was drift ahead of it.
type suspended struct {
	d, mono, drift time.Duration
}

var lastSuspended atomic.Pointer[suspended]

// sinceStart returns the time since the process started on
// CLOCK_BOOTTIME, which counts the time the machine spent suspended.
//
// Reading CLOCK_BOOTTIME is a system call (a microsecond; time.Now is
// twenty times cheaper), so it is read again only when the time suspended
// may have changed: when the wall clock moved against the monotonic clock
// by more than a millisecond (a suspend moves the one and not the other),
// and at least once a second.
func sinceStart() time.Duration {
	now := time.Now()
	mono := now.Sub(start)
	if !bootClock {
		return mono
	}
	drift := now.Round(0).Sub(start.Round(0)) - mono
	if s := lastSuspended.Load(); s != nil && mono-s.mono < time.Second && (drift-s.drift).Abs() < time.Millisecond {
		return mono + s.d
	}
	// The monotonic reading first: the boot clock's, later, can only make
	// the time suspended look longer, and validity shorter.
	bt, _ := bootTime()
	s := &suspended{d: max(bt-bootStart-mono, 0), mono: mono, drift: drift}
	lastSuspended.Store(s)
	return mono + s.d
}
