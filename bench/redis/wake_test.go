package redisbench

import (
	"context"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/fencedredis"
)

// BenchmarkWake isolates the notification path: time from the start of a
// release to a subscribed waiter in another driver being woken.
func BenchmarkWake(b *testing.B) {
	ctx := context.Background()
	srv := startServer(b)
	c1, _ := newClient(b, srv)
	c2, _ := newClient(b, srv)
	holder, _ := fencedredis.New(c1, nil)
	waiter, _ := fencedredis.New(c2, nil)
	defer holder.Close()
	defer waiter.Close()
	sub, err := waiter.Subscribe(ctx, "wake")
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Close()
	var wake, rel, ping []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		f, err := holder.TryAcquire(ctx, "wake", "owner", time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		// The waiter is refused once, as the Client's waiter is before it
		// waits; that refusal asks the release to publish.
		if _, err := waiter.TryAcquire(ctx, "wake", "waiter", time.Minute); err == nil {
			b.Fatal("the waiter got a held key")
		}
		time.Sleep(time.Millisecond)
		start := time.Now()
		c1.Ping(ctx) // the round-trip floor after the same idle gap
		ping = append(ping, time.Since(start))
		time.Sleep(time.Millisecond)
		start = time.Now()
		if err := holder.Release(ctx, driver.Grant{Key: "wake", Owner: "owner", Fence: f}); err != nil {
			b.Fatal(err)
		}
		rel = append(rel, time.Since(start))
		<-sub.C()
		wake = append(wake, time.Since(start))
	}
	reportPercentiles(b, ping, "idle-ping")
	reportPercentiles(b, rel, "release")
	reportPercentiles(b, wake, "wake")
}
