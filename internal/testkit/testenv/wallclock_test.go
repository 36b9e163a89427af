package testenv_test

import (
	"context"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/internal/testkit/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// near reports whether a and b are within a minute of each other: far
// tighter than the hour the tests step, far looser than any scheduling
// delay.
func near(a, b time.Time) bool { return a.Sub(b).Abs() < time.Minute }

// TestWallClockRedis steps a redis-server's wall clock: TIME and PX expiry
// follow the step.
func TestWallClockRedis(t *testing.T) {
	ctx := context.Background()
	clock := testenv.NewWallClock(t)
	srv := testenv.StartRedis(t, testenv.RedisConfig{WallClock: clock})
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer c.Close()
	serverTime := func() time.Time {
		t.Helper()
		now, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return now
	}
	if now := serverTime(); !near(now, time.Now()) {
		t.Fatalf("server time %v at offset 0, host %v", now, time.Now())
	}
	if err := c.Set(ctx, "k", "v", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	clock.Step(2 * time.Hour)
	if now := serverTime(); !near(now, time.Now().Add(2*time.Hour)) {
		t.Fatalf("server time %v after a 2h step, host %v", now, time.Now())
	}
	if n, err := c.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Fatalf("a key with a 1h PX still exists after a 2h step (%d, %v)", n, err)
	}
	clock.Step(-2 * time.Hour)
	if now := serverTime(); !near(now, time.Now()) {
		t.Fatalf("server time %v after stepping back, host %v", now, time.Now())
	}
}

// TestWallClockPostgres steps PostgreSQL's wall clock: now() follows it in
// every backend, including ones started before the step.
func TestWallClockPostgres(t *testing.T) {
	ctx := context.Background()
	clock := testenv.NewWallClock(t)
	pg := testenv.StartPostgresOnClock(t, clock)
	conn, err := pgx.Connect(ctx, pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	serverNow := func() time.Time {
		t.Helper()
		var now time.Time
		if err := conn.QueryRow(ctx, "SELECT now()").Scan(&now); err != nil {
			t.Fatal(err)
		}
		return now
	}
	if now := serverNow(); !near(now, time.Now()) {
		t.Fatalf("now() %v at offset 0, host %v", now, time.Now())
	}
	clock.Step(time.Hour)
	if now := serverNow(); !near(now, time.Now().Add(time.Hour)) {
		t.Fatalf("now() %v after a 1h step, host %v", now, time.Now())
	}
}

// TestWallClockKeepsMonotonic runs a process on a stepped clock beside
// one on the host's: their wall clocks differ by the step, their
// monotonic clocks (one clock for the whole host) do not.
func TestWallClockKeepsMonotonic(t *testing.T) {
	py := testenv.RequireBinary(t, "python3", "python3")
	clock := testenv.NewWallClock(t)
	clock.Step(3 * time.Hour)
	read := func(onClock bool) (wall, mono float64) {
		t.Helper()
		cmd := exec.Command(py, "-c", "import time; print(time.time(), time.clock_gettime(time.CLOCK_MONOTONIC))")
		if onClock {
			clock.Apply(cmd)
		}
		out, err := cmd.Output()
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(string(out))
		if len(f) != 2 {
			t.Fatalf("python printed %q", out)
		}
		wall, err1 := strconv.ParseFloat(f[0], 64)
		mono, err2 := strconv.ParseFloat(f[1], 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("python printed %q", out)
		}
		return wall, mono
	}
	hostWall, hostMono := read(false)
	wall, mono := read(true)
	if d := wall - hostWall; d < 3*3600-60 || d > 3*3600+60 {
		t.Fatalf("wall clock on a +3h clock is %.0fs ahead of the host's", d)
	}
	if d := mono - hostMono; d < 0 || d > 60 {
		t.Fatalf("monotonic clock on a +3h clock is %.0fs ahead of the host's, want untouched", d)
	}
}
