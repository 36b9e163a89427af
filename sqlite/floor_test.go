package sqlite_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/driver/drivertest"
	"github.com/fenced-dev/fenced/sqlite"
)

func TestFenceFloorAndPrune(t *testing.T) {
	path := filepath.Join(t.TempDir(), "leases.db")
	drivertest.RunFloorTests(t, drivertest.FloorHarness{
		OpenTable: func(t *testing.T, table string) driver.Driver {
			d, err := sqlite.OpenFile(context.Background(), path, &sqlite.Options{Table: table})
			if err != nil {
				t.Fatal(err)
			}
			return d
		},
	})
}
