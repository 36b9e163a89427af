package fencedsqlite_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/fencedsqlite"
	"github.com/fenced-dev/fenced/internal/testkit/leasebench"
)

// BenchmarkLeases runs the shared benchmarks (leasebench.Run):
// each driver is its own connection pool on one file, as another process
// would be. An embedded store has no round trips to count.
func BenchmarkLeases(b *testing.B) {
	path := filepath.Join(b.TempDir(), "leases.db")
	leasebench.Run(b, leasebench.Harness{
		Open: func(b *testing.B, _ *leasebench.RoundTrips) driver.Driver {
			d, err := fencedsqlite.OpenFile(context.Background(), path, nil)
			if err != nil {
				b.Fatal(err)
			}
			return d
		},
	})
}

// BenchmarkDriverAcquireRelease is the same pair straight on the driver,
// without the client's bookkeeping.
func BenchmarkDriverAcquireRelease(b *testing.B) {
	ctx := context.Background()
	d, err := fencedsqlite.OpenFile(ctx, filepath.Join(b.TempDir(), "leases.db"), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	owner := "0123456789abcdef0123456789abcdef"
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		f, err := d.TryAcquire(ctx, "bench:key", owner, time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		if err := d.Release(ctx, driver.Grant{Key: "bench:key", Owner: owner, Fence: f}); err != nil {
			b.Fatal(err)
		}
	}
}
