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

// BenchmarkHandover measures the time from a holder's release in one
// driver (as another process would be) to the acquire of a waiter blocked in
// another driver on the same file.
func BenchmarkHandover(b *testing.B) {
	ctx := context.Background()
	path := filepath.Join(b.TempDir(), "leases.db")
	open := func() *fenced.Client {
		d, err := sqlite.OpenFile(ctx, path, nil)
		if err != nil {
			b.Fatal(err)
		}
		return fenced.NewClient(d, nil)
	}
	holder, waiter := open(), open()
	defer holder.Close()
	defer waiter.Close()
	lat := make([]time.Duration, 0, b.N)
	for i := 0; i < b.N; i++ {
		l, err := holder.TryAcquire(ctx, "bench:handover", nil)
		if err != nil {
			b.Fatal(err)
		}
		got := make(chan time.Time, 1)
		go func() {
			w, err := waiter.Acquire(ctx, "bench:handover", &fenced.LeaseOptions{MaxWait: time.Minute})
			if err != nil {
				b.Error(err)
				got <- time.Time{}
				return
			}
			got <- time.Now()
			w.Release(ctx)
		}()
		time.Sleep(20 * time.Millisecond) // the waiter is waiting
		released := time.Now()
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
		at := <-got
		lat = append(lat, at.Sub(released))
		time.Sleep(5 * time.Millisecond)
	}
	reportPercentiles(b, lat)
}
