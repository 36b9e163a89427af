// Package ttlrule holds the TTL arithmetic the root package and the backends
// share: rounding a TTL up to an authority's unit, the default safety
// margin, and the check a renewal makes of the TTL its grant carries.
package ttlrule

import (
	"fmt"
	"time"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/core/sentinel"
)

// Min and Max bound every lease's TTL, and Default is the TTL of a lease
// whose options name none (fenced.LeaseOptions.TTL says them); a
// backend's Expiry may narrow the bounds.
const (
	Min     = 10 * time.Millisecond
	Max     = 7 * 24 * time.Hour
	Default = 30 * time.Second
)

// Units converts ttl to a whole number of unit (a microsecond, a
// millisecond, a second: whatever the authority counts in), rounding up.
// It is the one TTL rounding rule of every driver. A TTL is never
// shortened: a grant must not end before the holder's local validity,
// which is measured on the full TTL. A positive TTL is never rounded down
// to zero. A ttl of zero or less gives 0. A unit of zero or less is taken
// as a nanosecond.
func Units(ttl, unit time.Duration) int64 {
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

// DefaultSafetyMargin is the allowance for clock drift and round trip
// subtracted from a TTL when the lease's options name none: 1% of the TTL
// plus 2ms. Redlock's TryAcquire, called outside a lease, uses it as its
// drift allowance too, so both agree.
func DefaultSafetyMargin(ttl time.Duration) time.Duration { return ttl/100 + 2*time.Millisecond }

// Check returns an error matching sentinel.ErrInvalidTTL unless g.TTL is
// positive. Renew and RenewBatch check it before anything else. A grant
// built without its TTL would otherwise be "renewed" for nothing (Redis's
// PEXPIRE 0 deletes the key and reports success).
func Check(g driver.Grant) error {
	if g.TTL <= 0 {
		return fmt.Errorf("renew %s: %w: the grant carries no TTL (%v)", g, sentinel.ErrInvalidTTL, g.TTL)
	}
	return nil
}

// CheckAll is Check for every grant of a batch.
func CheckAll(grants []driver.Grant) error {
	for _, g := range grants {
		if err := Check(g); err != nil {
			return err
		}
	}
	return nil
}
