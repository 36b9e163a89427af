package fencedredis_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// TestURLClientHonoursDeadlines: a client opened from a redis:// URL
// returns at its context's deadline when the link to Redis drops every
// packet (a proxy that stops forwarding), for Inspect, TryAcquire and
// Renew alike. go-redis ignores context deadlines unless
// ContextTimeoutEnabled is set: each call then waited out its
// ReadTimeout (5s).
func TestURLClientHonoursDeadlines(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisConfig{Password: "s3cret"})
	px := testenv.StartProxy(t, srv.Addr())
	viaProxy := strings.Replace(srv.URL(), srv.Addr(), px.Addr, 1)
	ctx := testCtx(t)
	c, err := fenced.Open(ctx, viaProxy, &fenced.Options{MinFence: fenced.FenceRepeatable})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	held, err := c.TryAcquire(ctx, "deadline:held", &fenced.LeaseOptions{TTL: time.Minute, ManualRenew: true})
	if err != nil {
		t.Fatal(err)
	}
	// What this run's machine takes for a round trip and a timer (the
	// worst of a few): the slack allowed past each deadline is derived
	// from it.
	var rtt, late time.Duration
	for range 5 {
		began := time.Now()
		if _, err := c.Inspect(ctx, "deadline:held"); err != nil {
			t.Fatal(err)
		}
		rtt = max(rtt, time.Since(began))
		began = time.Now()
		time.Sleep(10 * time.Millisecond)
		late = max(late, time.Since(began)-10*time.Millisecond)
	}

	px.BlackHole(true)
	t.Cleanup(func() { px.BlackHole(false) }) // before Close releases
	const deadline = 200 * time.Millisecond
	// A call ends at its deadline, plus scheduling: eight times this run's
	// worst round trip and timer lateness, and at least 500ms, well under
	// the 5s ReadTimeout a call waited before.
	bound := deadline + max(500*time.Millisecond, 8*(rtt+late))
	calls := []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"Inspect", func(ctx context.Context) error { _, err := c.Inspect(ctx, "deadline:held"); return err }},
		{"TryAcquire", func(ctx context.Context) error {
			_, err := c.TryAcquire(ctx, "deadline:free", &fenced.LeaseOptions{TTL: time.Minute})
			return err
		}},
		{"Renew", held.Renew},
	}
	for _, tc := range calls {
		cctx, cancel := context.WithTimeout(ctx, deadline)
		began := time.Now()
		err := tc.call(cctx)
		took := time.Since(began)
		cancel()
		t.Logf("%s with a %v deadline through the black hole: %v after %v (bound %v)", tc.name, deadline, err, took, bound)
		if err == nil {
			t.Fatalf("%s succeeded through a black hole", tc.name)
		}
		if took > bound {
			t.Fatalf("%s returned %v after its %v deadline (bound %v: rtt %v, timer lateness %v)", tc.name, took, deadline, bound, rtt, late)
		}
	}
}
