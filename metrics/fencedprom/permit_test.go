package fencedprom_test

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/metrics/fencedprom"
	"github.com/fenced-dev/fenced/recipe"
)

// TestSemaphorePermitsAreOneGroup checks that the permits of a semaphore
// are counted under the semaphore's name, one group for its N slots, while
// a key that only looks like a permit ("build#1", taken directly) is
// grouped as any other key.
func TestSemaphorePermitsAreOneGroup(t *testing.T) {
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	m, err := fencedprom.New(reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := fenced.Open(ctx, "mem://permit-groups", &fenced.Options{Hook: m.Hook("mem")})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sem, err := recipe.NewSemaphore(c, "encoders", 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		p, err := sem.TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Release(ctx)
	}
	if _, err := sem.TryAcquire(ctx); err == nil {
		t.Fatal("a fourth permit was granted")
	}
	l, err := c.TryAcquire(ctx, "build#1", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	got, err := testutil.GatherAndCount(reg, "fenced_leases_held")
	if err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var groups []string
	for _, mf := range mfs {
		if mf.GetName() != "fenced_leases_held" {
			continue
		}
		for _, s := range mf.GetMetric() {
			for _, lp := range s.GetLabel() {
				if lp.GetName() == "key_group" {
					groups = append(groups, lp.GetName()+"="+lp.GetValue()+" "+s.GetGauge().String())
				}
			}
		}
	}
	joined := strings.Join(groups, "; ")
	if got != 2 || !strings.Contains(joined, "key_group=encoders value:3") || !strings.Contains(joined, "key_group=build#1 value:1") {
		t.Fatalf("fenced_leases_held has %d series: %s; want encoders (3 held) and build#1 (1)", got, joined)
	}
}
