package clock

import (
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

// sinceStart returns the time since the process started on
// CLOCK_BOOTTIME, which counts the time the machine spent suspended.
func sinceStart() time.Duration {
	if !bootClock {
		return time.Since(start)
	}
	now, _ := bootTime()
	return now - bootStart
}
