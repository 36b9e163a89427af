package fencedredis

import "github.com/fenced-dev/fenced/internal/backend/rediskit"

// NudgeMin is nudgeMin, for the tests' bounds.
const NudgeMin = nudgeMin

// SetCommands makes d renew and release with n's commands, as if its probe
// had found n (for the benchmark's comparison).
func SetCommands(d *Driver, n rediskit.Native) {
	d.nativeMu.Lock()
	d.native = &n
	d.nativeMu.Unlock()
}
