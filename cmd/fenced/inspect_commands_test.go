package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedredis"
	"github.com/fenced-dev/fenced/internal/core/rootaccess"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// TestInspectSaysRedisCommands checks that inspect on a Redis store says
// whether renewal is the server's SET IFEQ or a script, as the driver
// probed it, and that a store without the choice prints no such line.
func TestInspectSaysRedisCommands(t *testing.T) {
	t.Parallel()
	store := testenv.StartRedis(t, testenv.RedisConfig{}).URL()
	c := client(t, store)
	ctx := context.Background()
	l, err := c.Acquire(ctx, "cli:commands", &fenced.LeaseOptions{TTL: time.Minute, MinFence: fenced.FenceRepeatable})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	want := "commands:   " + rootaccess.Driver(c).(*fencedredis.Driver).Commands(ctx) + "\n"
	r := cli(t, store, "inspect", "cli:commands")
	if r.code != 0 || !strings.Contains(r.stdout, want) {
		t.Fatalf("inspect on %s: exit %d, stdout %q, stderr %q; want a line %q", testenv.RedisVersion(t), r.code, r.stdout, r.stderr, want)
	}
	sqlite := tempStore(t)
	sl, err := client(t, sqlite).Acquire(ctx, "cli:commands", &fenced.LeaseOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer sl.Release(ctx)
	if r := cli(t, sqlite, "inspect", "cli:commands"); r.code != 0 || strings.Contains(r.stdout, "commands:") {
		t.Fatalf("inspect on SQLite: exit %d, stdout %q; want no commands line", r.code, r.stdout)
	}
}
