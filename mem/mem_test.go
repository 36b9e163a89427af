package mem_test

import (
	"sync"
	"testing"

	"github.com/fenced-dev/fenced/clock"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/driver/drivertest"
	"github.com/fenced-dev/fenced/mem"
)

func TestConformance(t *testing.T) {
	store := mem.NewStore(nil)
	var mu sync.Mutex
	byClock := map[clock.Clock]*mem.Store{}
	drivertest.RunConformanceTests(t, drivertest.Harness{
		Open: func(*testing.T) driver.Driver { return store.Driver() },
		OpenWithClock: func(_ *testing.T, clk clock.Clock) driver.Driver {
			mu.Lock()
			defer mu.Unlock()
			if byClock[clk] == nil {
				byClock[clk] = mem.NewStore(clk)
			}
			return byClock[clk].Driver()
		},
		BadURLs: []string{"mem://name/path", "mem://x?y=1", "mem://x?y;z", "mem:opaque", "://nothing", "", "nosuchscheme://x"},
	})
}
