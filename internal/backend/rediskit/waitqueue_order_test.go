package rediskit

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/internal/testkit/testenv"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sys/unix"
)

// TestRefusedUnderOneGrantTie refuses 1000 processes under one grant,
// with redis-server sharing one CPU with three threads that spin (a busy
// machine: the server is descheduled, mid-script too, every few ms): each
// enters the waiter queue until the grant's expiry plus the slack, the
// same instant for all of them, so they tie and the queue orders them by
// member, as every node of a Redlock does. The entries were scored
// now + PTTL, read apart in the script: a server descheduled in between
// scored the process a millisecond or more later, nodes ordered the same
// processes differently, and one release woke a different process on each
// (TestReleaseWakesOneProcess in fencedredlock).
func TestRefusedUnderOneGrantTie(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisConfig{NoPersistence: true})
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer c.Close()
	ctx := context.Background()
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	_, rest, _ := strings.Cut(info, "process_id:")
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(rest, "\n", 2)[0]))
	if err != nil {
		t.Fatalf("no process_id in INFO server: %v", err)
	}
	var cpu0 unix.CPUSet
	cpu0.Set(0)
	if err := unix.SchedSetaffinity(pid, &cpu0); err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var spinners sync.WaitGroup
	for range 3 {
		spinners.Add(1)
		go func() {
			defer spinners.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			if err := unix.SchedSetaffinity(0, &cpu0); err != nil {
				t.Error(err)
				return
			}
			for !stop.Load() {
			}
		}()
	}
	defer spinners.Wait()
	defer stop.Store(true)
	lock, counter, queue := "t:{k}:lock", "t:{k}:fence", "t:{k}:waitq"
	// The grant outlives the test: 1000 refusals took over a minute with
	// the server descheduled behind the spinners on a busy machine.
	if err := c.Set(ctx, lock, "7:other", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	const slack = 1000
	const n = 1000
	for i := range n {
		res, err := Acquire.Run(ctx, c, []string{lock, counter, queue}, fmt.Sprintf("owner-%d", i), 60000, 1, slack, fmt.Sprintf("p%03d:1", i)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if a := ParseAcquire(res); a.Status != StatusHeld {
			t.Fatalf("acquire %d of a held key = %+v, want held", i, a)
		}
	}
	exp, err := c.PExpireTime(ctx, lock).Result()
	if err != nil {
		t.Fatal(err)
	}
	zs, err := c.ZRangeWithScores(ctx, queue, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(zs) != n {
		t.Fatalf("the queue holds %d processes, want %d", len(zs), n)
	}
	want := float64(exp.Milliseconds() + slack)
	late := 0
	for _, z := range zs {
		if z.Score != want {
			late++
		}
	}
	if late > 0 {
		t.Fatalf("%d of %d processes refused under one grant stand until another time than its expiry plus the slack (%d): %v ... %v", late, n, int64(want), zs[0], zs[n-1])
	}
}
