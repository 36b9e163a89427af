package rediskit

import (
	"context"
	"io/fs"
	"testing"

	"github.com/fenced-dev/fenced/internal/testkit/testenv"
	"github.com/redis/go-redis/v9"
)

// TestScriptsLoad checks that every file of lua/ is part of a script and
// that every script compiles on a real redis-server (SCRIPT LOAD), so a
// file left over, or a local function a script calls but does not
// include, fails here rather than on a user's first grant.
func TestScriptsLoad(t *testing.T) {
	files, err := fs.Glob(luaFiles, "lua/*.lua")
	if err != nil || len(files) == 0 {
		t.Fatalf("no embedded Lua files (%v)", err)
	}
	for _, f := range files {
		if !luaUsed[f[len("lua/"):]] {
			t.Errorf("%s is part of no script", f)
		}
	}
	srv := testenv.StartRedis(t, testenv.RedisConfig{NoPersistence: true})
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer c.Close()
	ctx := context.Background()
	for name, s := range scripts() {
		if err := s.Load(ctx, c).Err(); err != nil {
			t.Errorf("%s does not load: %v", name, err)
		}
	}
	// A script that calls a local function it does not include compiles
	// but fails when it runs: run each acquire once on a held key, the
	// branch that calls held.
	lock, counter, claim := "t:{k}:lock", "t:{k}:fence", "t:{k}:claim"
	for _, s := range []*redis.Script{Acquire, AcquireNode} {
		c.Set(ctx, lock, "7:other", 0)
		res, err := s.Run(ctx, c, []string{lock, counter, claim}, "me", 1000, "0", 1).Result()
		if err != nil {
			t.Fatalf("acquire on a held key: %v", err)
		}
		if a := ParseAcquire(res); a.Status != StatusHeld || a.Fence != 7 {
			t.Errorf("acquire on a key held with fence 7 = %+v, want held with fence 7", a)
		}
	}
	res, err := RenewMany.Run(ctx, c, []string{lock}, "7:other", 1000).Slice()
	if err != nil || len(res) != 1 || res[0] != int64(1) {
		t.Errorf("RenewMany of the holder's grant = %v, %v; want [1]", res, err)
	}
}

// scripts lists every script, for the test that loads them.
func scripts() map[string]*redis.Script {
	return map[string]*redis.Script{
		"Acquire": Acquire, "AcquireNode": AcquireNode, "Renew": Renew, "RenewMany": RenewMany,
		"RenewManyAcross": RenewManyAcross, "Release": Release, "ReleaseWaiters": ReleaseWaiters,
		"ReleaseAttempt": ReleaseAttempt, "Inspect": Inspect, "Break": Break,
	}
}
