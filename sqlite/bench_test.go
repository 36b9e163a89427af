package sqlite_test

import (
	"context"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/sqlite"
)

// BenchmarkAcquireRelease measures an uncontended TryAcquire + Release
// through the portable client: two statements, each one fsync'd commit.
func BenchmarkAcquireRelease(b *testing.B) {
	ctx := context.Background()
	d, err := sqlite.OpenFile(ctx, filepath.Join(b.TempDir(), "leases.db"), nil)
	if err != nil {
		b.Fatal(err)
	}
	c := fenced.NewClient(d, nil)
	defer c.Close()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		l, err := c.TryAcquire(ctx, "bench:key", &fenced.LeaseOptions{TTL: time.Minute})
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	reportPercentiles(b, lat)
}

// BenchmarkDriverAcquireRelease is the same pair straight on the driver,
// without the client's bookkeeping.
func BenchmarkDriverAcquireRelease(b *testing.B) {
	ctx := context.Background()
	d, err := sqlite.OpenFile(ctx, filepath.Join(b.TempDir(), "leases.db"), nil)
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

func reportPercentiles(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}
