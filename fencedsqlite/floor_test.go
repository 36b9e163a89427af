package fencedsqlite_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/drivertest"
	"github.com/fenced-dev/fenced/fencedsqlite"
)

func TestFenceFloorAndPrune(t *testing.T) {
	path := filepath.Join(t.TempDir(), "leases.db")
	drivertest.RunFloorTests(t, drivertest.FloorHarness{
		OpenTable: func(t *testing.T, table string) driver.Driver {
			d, err := fencedsqlite.OpenFile(context.Background(), path, &fencedsqlite.Options{Table: table})
			if err != nil {
				t.Fatal(err)
			}
			return d
		},
	})
}
