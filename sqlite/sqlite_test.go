package sqlite_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/driver/drivertest"
	"github.com/fenced-dev/fenced/sqlite"
)

func TestConformance(t *testing.T) {
	path := filepath.Join(t.TempDir(), "leases.db")
	drivertest.RunConformanceTests(t, drivertest.Harness{
		Open: func(t *testing.T) driver.Driver {
			d, err := sqlite.OpenFile(context.Background(), path, nil)
			if err != nil {
				t.Fatal(err)
			}
			return d
		},
		BadURLs: []string{
			"sqlite://host/file.db",
			"sqlite:" + path + "?table=bad-name",
			"sqlite:" + path + "?table=x;drop",
			"sqlite:" + path + "?busy_timeout=soon",
			"sqlite:" + path + "?nosuch=1",
		},
	})
}
