package main

import (
	"context"
	"encoding/json"
	"errors"
	"github.com/fenced-dev/fenced/internal/core/limits"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/internal/testkit/testenv"

	"github.com/fenced-dev/fenced"
)

// cycleKey grants key through c and releases it, returning the fence.
func cycleKey(t *testing.T, c *fenced.Client, key string) uint64 {
	t.Helper()
	ctx := context.Background()
	l, err := c.TryAcquire(ctx, key, &fenced.LeaseOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	return l.Fence()
}

// A key's counter restarts on a new store; seeding the new store's floor
// from the old one (fenced floor raise --from) keeps it above every fence
// handed out before (issue 16 item 13).
func TestFloorCommands(t *testing.T) {
	t.Parallel()
	oldStore, newStore := tempStore(t), tempStore(t)
	old := client(t, oldStore)
	for range 3 {
		cycleKey(t, old, "job:moved")
	}
	r := cli(t, oldStore, "floor", "-o", "json")
	var info floorJSON
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &info) != nil || info != (floorJSON{Floor: 0, MaxFence: 3}) {
		t.Fatalf("floor -o json: exit %d, %q %s; want floor 0, max fence 3", r.code, r.stdout, r.stderr)
	}
	if r := cli(t, oldStore, "floor"); r.code != 0 || !strings.Contains(r.stdout, "highest fence:  3") {
		t.Fatalf("floor: exit %d, %q", r.code, r.stdout)
	}
	r = cli(t, newStore, "floor", "raise", "--from", oldStore)
	if r.code != 0 || !strings.Contains(r.stdout, "is now 3") {
		t.Fatalf("floor raise --from: exit %d, %q %s", r.code, r.stdout, r.stderr)
	}
	if f := cycleKey(t, client(t, newStore), "job:moved"); f != 4 {
		t.Fatalf("moved key in the seeded store: fence %d, want 4", f)
	}
	r = cli(t, newStore, "floor", "raise", "100")
	if r.code != 0 || !strings.Contains(r.stdout, "is now 100") {
		t.Fatalf("floor raise 100: exit %d, %q %s", r.code, r.stdout, r.stderr)
	}
	r = cli(t, newStore, "floor", "raise", "50")
	if r.code != 0 || !strings.Contains(r.stdout, "is 100, already above 50; unchanged") {
		t.Fatalf("floor raise 50 after 100: exit %d, %q %s", r.code, r.stdout, r.stderr)
	}
	if f := cycleKey(t, client(t, newStore), "job:other"); f != 101 {
		t.Fatalf("new key after floor raise 100: fence %d, want 101", f)
	}
}

// Pruning deletes released rows and raises the floor, so the keys it
// deleted come back above their old fences.
func TestPruneCommand(t *testing.T) {
	t.Parallel()
	store := tempStore(t)
	c := client(t, store)
	var last uint64
	for range 5 {
		last = cycleKey(t, c, "job:old")
	}
	held, err := c.TryAcquire(context.Background(), "job:held", &fenced.LeaseOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	r := cli(t, store, "prune", "--older-than", "1h", "-o", "json")
	var res pruneJSON
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &res) != nil || res.Deleted != 1 || res.Floor != last {
		t.Fatalf("prune -o json: exit %d, %q %s; want 1 deleted, floor %d", r.code, r.stdout, r.stderr, last)
	}
	if _, err := c.Inspect(context.Background(), "job:old"); !errors.Is(err, fenced.ErrNotFound) {
		t.Fatalf("pruned key: %v, want ErrNotFound", err)
	}
	if _, err := c.Inspect(context.Background(), held.Key()); err != nil {
		t.Fatalf("held key after prune: %v", err)
	}
	if f := cycleKey(t, c, "job:old"); f <= last {
		t.Fatalf("pruned key granted again: fence %d, want above %d", f, last)
	}
	if r := cli(t, store, "prune", "--older-than", "0s"); r.code != 0 || !strings.Contains(r.stdout, "pruned 1 keys") || !strings.Contains(r.stdout, "fence floor is "+strconv.FormatUint(last+1, 10)) {
		t.Fatalf("prune table output: exit %d, %q %s", r.code, r.stdout, r.stderr)
	}
}

func TestFloorAndPruneBadInput(t *testing.T) {
	t.Parallel()
	store := tempStore(t)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"floor", "raise"}, 64, "give the new floor N, or --from STORE"},
		{[]string{"floor", "raise", "many"}, 64, `"many" is not a number`},
		{[]string{"floor", "raise", "-5"}, 64, ""},
		{[]string{"floor", "raise", strconv.FormatUint(limits.MaxFenceFloor+1, 10)}, 64, "is not a number from 0 to"},
		{[]string{"floor", "raise", "5", "--from", store}, 64, "not both"},
		{[]string{"floor", "raise", "--from", "nosuch://x"}, 64, "unknown scheme"},
		{[]string{"floor", "-o", "yaml"}, 64, "--output"},
		{[]string{"prune"}, 64, "--older-than is required"},
		{[]string{"prune", "--older-than", "-1s"}, 64, "negative"},
		{[]string{"prune", "--older-than", "a while"}, 64, "older-than"},
		// mem keeps a floor too (the reference backend has every
		// capability); TestFloorUnsupportedOnRedis covers a store without.
		{[]string{"--store", "mem://x", "floor"}, 0, ""},
		{[]string{"--store", "mem://x", "prune", "--older-than", "1h"}, 0, ""},
	} {
		r := cli(t, store, tc.args...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("fenced %q: exit %d stderr %q; want %d and %q", tc.args, r.code, r.stderr, tc.code, tc.want)
		}
	}
	if fl, _, err := client(t, store).FenceFloor(context.Background()); err != nil || fl != 0 {
		t.Errorf("after refused commands the floor is %d, %v; want 0", fl, err)
	}
}

// The commands work on the server-backed SQL stores too: a raised floor
// lifts the next grant, and prune deletes a released key whose fence then
// comes back above its old one.
// A store that keeps no fence floor (Redis) refuses floor and prune with
// exit 1 and says which stores keep one.
func TestFloorUnsupportedOnRedis(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t, testenv.RedisConfig{})
	store := tempStore(t)
	for _, args := range [][]string{
		{"--store", r.URL(), "floor"},
		{"--store", r.URL(), "prune", "--older-than", "1h"},
	} {
		res := cli(t, store, args...)
		if res.code != 1 || !strings.Contains(res.stderr, "only the SQL stores") {
			t.Errorf("fenced %q: exit %d stderr %q; want 1 and %q", args, res.code, res.stderr, "only the SQL stores")
		}
	}
}

func TestFloorAndPruneOnSQLServers(t *testing.T) {
	for _, bc := range backendCases {
		if bc.name != "postgres" && bc.name != "mysql" {
			continue
		}
		t.Run(bc.name, func(t *testing.T) {
			t.Parallel() // mostly waiting for servers to start
			store := bc.start(t)
			c := client(t, store)
			if r := cli(t, store, "floor", "raise", "1000"); r.code != 0 || !strings.Contains(r.stdout, "is now 1000") || strings.Contains(r.stdout, "secret") {
				t.Fatalf("floor raise 1000: exit %d, %q %s", r.code, r.stdout, r.stderr)
			}
			f := cycleKey(t, c, "job:sql")
			if f != 1001 {
				t.Fatalf("grant after floor raise 1000: fence %d, want 1001", f)
			}
			time.Sleep(10 * time.Millisecond) // PostgreSQL keeps the release time
			r := cli(t, store, "prune", "--older-than", "0s", "-o", "json")
			var res pruneJSON
			if r.code != 0 || json.Unmarshal([]byte(r.stdout), &res) != nil || res.Deleted != 1 || res.Floor != f {
				t.Fatalf("prune: exit %d, %q %s; want 1 deleted, floor %d", r.code, r.stdout, r.stderr, f)
			}
			if g := cycleKey(t, c, "job:sql"); g <= f {
				t.Fatalf("pruned key granted again: fence %d, want above %d", g, f)
			}
		})
	}
}

// TestFloorRaiseNegative checks that a negative N is refused as a number
// out of range, not as cobra's unknown flag, and raises nothing.
func TestFloorRaiseNegative(t *testing.T) {
	t.Parallel()
	store := tempStore(t)
	r := cli(t, store, "floor", "raise", "-5")
	if r.code != exitUsage || !strings.Contains(r.stderr, `"-5" is not a number from 0 to`) {
		t.Fatalf("floor raise -5: exit %d, %q; want exit %d naming -5 as out of range", r.code, r.stderr, exitUsage)
	}
	if f := cycleKey(t, client(t, store), "job:after"); f != 1 {
		t.Fatalf("a key after the refused raise got fence %d, want 1", f)
	}
}
