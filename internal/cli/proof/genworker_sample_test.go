package proof

import (
	"context"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/core/rootaccess"
	"github.com/fenced-dev/fenced/mem"
)

// TestSamplerSeesUnchangedValidity re-reads the validity of a lease that
// is not renewed meanwhile: the sampler must take it as unchanged every
// time, or it skips the sample. Comparing ValidUntil's readings for
// equality did so for about two thirds of them (each reading maps the
// client's clock onto time.Now's anew, a few nanoseconds apart), so the
// checker missed most leases live past their validity.
func TestSamplerSeesUnchangedValidity(t *testing.T) {
	c := fenced.NewClient(mem.New(nil), nil)
	defer c.Close()
	l, err := c.TryAcquire(context.Background(), "k", &fenced.LeaseOptions{TTL: time.Minute, ManualRenew: true})
	if err != nil {
		t.Fatal(err)
	}
	missed := 0
	for range 10000 {
		if renewedSince(l, rootaccess.ValidUntil(l)) {
			missed++
		}
	}
	if missed > 0 {
		t.Errorf("%d of 10000 readings of an unrenewed lease's validity were taken for a renewal", missed)
	}
}
