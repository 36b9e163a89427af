package driver

import "time"

// TTLUnits converts ttl to a whole number of unit (a microsecond, a
// millisecond, a second: whatever the authority counts in), rounding up. It
// is the one TTL rounding rule of every driver. A TTL is never shortened: a
// grant must not end before the holder's local validity, which is measured
// on the full TTL. A positive TTL is never rounded down to zero. A ttl of
// zero or less gives 0. A unit of zero or less is taken as a nanosecond.
func TTLUnits(ttl, unit time.Duration) int64 {
	if ttl <= 0 {
		return 0
	}
	if unit <= 0 {
		unit = time.Nanosecond
	}
	n := int64(ttl / unit)
	if ttl%unit != 0 {
		n++
	}
	return n
}
