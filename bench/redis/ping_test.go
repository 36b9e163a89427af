package redisbench

import (
	"context"
	"testing"
	"time"
)

// BenchmarkPing is the round-trip floor of this machine, for scale.
func BenchmarkPing(b *testing.B) {
	srv := startServer(b)
	c, _ := newClient(b, srv)
	ctx := context.Background()
	c.Ping(ctx)
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		if err := c.Ping(ctx).Err(); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	reportPercentiles(b, lat, "ping")
}
