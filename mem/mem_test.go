package mem_test

import (
	"sync"
	"testing"

	"github.com/fenced-dev/fenced/clock"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/drivertest"
	"github.com/fenced-dev/fenced/mem"
	"github.com/fenced-dev/fenced/recipe/recipetest"
)

// TestConformance runs the suite on mem twice, with every capability
// declared: waiters woken through Subscribe, and with Options.Queue (a
// FIFO queue), so that between the two every test of the suite runs.
func TestConformance(t *testing.T) {
	for _, c := range []struct {
		name string
		opts mem.Options
	}{
		{"Subscribe", mem.Options{Terms: true, BatchRenew: true}},
		{"Queue", mem.Options{Queue: true, Terms: true, BatchRenew: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel() // stores of their own
			store := mem.NewStore(nil)
			var mu sync.Mutex
			byClock := map[clock.Clock]*mem.Store{}
			h := drivertest.Harness{
				Open: func(*testing.T) driver.Driver { return store.DriverWith(c.opts) },
				OpenWithClock: func(_ *testing.T, clk clock.Clock) driver.Driver {
					mu.Lock()
					defer mu.Unlock()
					if byClock[clk] == nil {
						byClock[clk] = mem.NewStore(clk)
					}
					return byClock[clk].DriverWith(c.opts)
				},
				BadURLs: []string{"mem://name/path", "mem://x?y=1", "mem://x?y;z", "mem:opaque", "://nothing", "", "nosuchscheme://x"},
			}
			drivertest.RunConformanceTests(t, h)
			recipetest.RunConformanceTests(t, h)
		})
	}
}

// TestFloor runs the fence floor and prune suite on mem, a store per
// table.
func TestFloor(t *testing.T) {
	var mu sync.Mutex
	stores := map[string]*mem.Store{}
	drivertest.RunFloorTests(t, drivertest.FloorHarness{
		OpenTable: func(_ *testing.T, table string) driver.Driver {
			mu.Lock()
			defer mu.Unlock()
			if stores[table] == nil {
				stores[table] = mem.NewStore(nil)
			}
			return stores[table].Driver()
		},
	})
}
