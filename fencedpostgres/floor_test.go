package fencedpostgres_test

import (
	"testing"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/drivertest"
	"github.com/fenced-dev/fenced/fencedpostgres"
)

func TestFenceFloorAndPrune(t *testing.T) {
	drivertest.RunFloorTests(t, drivertest.FloorHarness{
		OpenTable: func(t *testing.T, table string) driver.Driver {
			d, err := fencedpostgres.Open(ctxT(t), pg.URL("table="+table, "notify=off"))
			if err != nil {
				t.Fatal(err)
			}
			return d
		},
	})
}
