//go:build !linux

package clock

import "time"

// bootClock reports that the boot clock counts suspended time: not here (see
// the package comment).
const bootClock = false

// suspendedSince returns zero: package time's monotonic clock is the boot
// clock here.
func suspendedSince(time.Time) time.Duration { return 0 }
