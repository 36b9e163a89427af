package leasebench

import (
	"fmt"
	"testing"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
)

// Harness tells Run how to reach the store under test.
type Harness struct {
	// Open returns a new driver on the store, as another process would
	// make. When rt is not nil the driver's connections must be dialled
	// with rt.Dial, so that round trips are counted; a backend that
	// cannot (an embedded store) ignores rt and reports no round trips.
	// Run closes what it opens.
	Open func(b *testing.B, rt *RoundTrips) driver.Driver
	// CountsRoundTrips says Open honours rt.
	CountsRoundTrips bool
	// Options are the options of every client Run opens (nil:
	// the defaults).
	Options *fenced.Options
	// Waiters are the numbers of waiters of the handover benchmarks.
	// Default 1, 8 and 64.
	Waiters []int
}

// Run runs the benchmarks every backend runs the same way, so that their
// figures compare, on the drivers h opens. AcquireRelease is an uncontended
// TryAcquire and Release of one key through the portable client, with round
// trips per operation where counted. Handover/waiters=N runs from a
// holder's release to the next waiter's grant, each participant its own
// client, and reports p50 and p99.
func Run(b *testing.B, h Harness) {
	waiters := h.Waiters
	if len(waiters) == 0 {
		waiters = []int{1, 8, 64}
	}
	open := func(b *testing.B, rt *RoundTrips) *fenced.Client {
		c := fenced.NewClient(h.Open(b, rt), h.Options)
		b.Cleanup(func() { c.Close() })
		return c
	}
	b.Run("AcquireRelease", func(b *testing.B) {
		if !h.CountsRoundTrips {
			AcquireRelease(b, open(b, nil), nil)
			return
		}
		var rt RoundTrips
		AcquireRelease(b, open(b, &rt), &rt)
	})
	for _, n := range waiters {
		b.Run(fmt.Sprintf("Handover/waiters=%d", n), func(b *testing.B) {
			Handover(b, n, func(b *testing.B) *fenced.Client { return open(b, nil) })
		})
	}
}
