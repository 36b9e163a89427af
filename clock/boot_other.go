//go:build !linux

package clock

import "time"

// bootClock reports that sinceStart counts suspended time: not here (see
// the package comment).
const bootClock = false

// sinceStart returns the time since the process started on package
// time's monotonic clock.
func sinceStart() time.Duration { return time.Since(start) }
