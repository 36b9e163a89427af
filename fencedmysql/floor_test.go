package fencedmysql_test

import (
	"testing"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/drivertest"
	"github.com/fenced-dev/fenced/fencedmysql"
)

func TestFenceFloorAndPrune(t *testing.T) {
	drivertest.RunFloorTests(t, drivertest.FloorHarness{
		OpenTable: func(t *testing.T, table string) driver.Driver {
			d, err := fencedmysql.Open(ctxT(t), my.URL("table="+table))
			if err != nil {
				t.Fatal(err)
			}
			return d
		},
	})
}

// Under READ COMMITTED a plain subquery is a non-locking read; the grant's
// read of the floor must still wait for a prune in progress.
func TestFenceFloorAndPruneReadCommitted(t *testing.T) {
	drivertest.RunFloorTests(t, drivertest.FloorHarness{
		OpenTable: func(t *testing.T, table string) driver.Driver {
			d, err := fencedmysql.Open(ctxT(t), my.URL("table="+table, "tx_isolation=%27READ-COMMITTED%27"))
			if err != nil {
				t.Fatal(err)
			}
			return d
		},
	})
}
