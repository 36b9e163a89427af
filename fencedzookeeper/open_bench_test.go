package fencedzookeeper_test

import (
	"context"
	"testing"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// BenchmarkOpenAcquire opens a client on ZooKeeper, takes and releases one
// lease, and closes it: what a short-lived process (a cron job, the CLI)
// pays. -benchmem's B/op counts the connections' buffers.
func BenchmarkOpenAcquire(b *testing.B) {
	ens := testenv.StartZooKeeper(b)
	url := ens.URL("/openbench", "")
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		c, err := fenced.Open(ctx, url, nil)
		if err != nil {
			b.Fatal(err)
		}
		l, err := c.TryAcquire(ctx, "job", nil)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
		if err := c.Close(); err != nil {
			b.Fatal(err)
		}
	}
}
