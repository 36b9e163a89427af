package proof

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/clock"
	"github.com/fenced-dev/fenced/fenceddynamodb"
)

// rateClock is a clock that runs at rate times the speed of the real one
// (rate 4: four seconds pass on it for every real second; 0.25: a quarter
// of a second), as a machine whose oscillator is off would: the clock
// skew by rate, not by a step, that observed expiry is exposed to (see
// docs/no-server-clock.md). Its readings start at the real clock's.
type rateClock struct {
	real  clock.Clock
	start time.Time
	rate  float64
}

func newRateClock(rate float64) *rateClock {
	r := clock.Real()
	return &rateClock{real: r, start: r.Now(), rate: rate}
}

// Now returns the start plus rate times the real time elapsed since.
func (c *rateClock) Now() time.Time {
	return c.start.Add(time.Duration(float64(c.real.Now().Sub(c.start)) * c.rate))
}

// NewTimer returns a timer that fires once d has passed on this clock:
// d/rate on the real one.
func (c *rateClock) NewTimer(d time.Duration) clock.Timer {
	return c.real.NewTimer(time.Duration(float64(d) / c.rate))
}

// openSkewed opens store with opts, on a clock running at rate (0: the
// real clock). A skewed clock must reach the driver too, which only the
// DynamoDB backend, whose driver watches grants on its own clock, takes
// from here.
func openSkewed(ctx context.Context, store string, opts *fenced.Options, rate float64) (*fenced.Client, error) {
	if rate == 0 {
		return fenced.Open(ctx, store, opts)
	}
	if rate < 0 || !strings.HasPrefix(store, "dynamodb://") {
		return nil, fmt.Errorf("proof: clock rate %v on %s: only a positive rate on a dynamodb:// store", rate, store)
	}
	clk := newRateClock(rate)
	drv, err := fenceddynamodb.OpenWith(ctx, store, &fenceddynamodb.Options{Clock: clk})
	if err != nil {
		return nil, err
	}
	o := *opts
	o.Clock = clk
	return fenced.NewClient(drv, &o), nil
}
