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
		"ReleaseAttempt": ReleaseAttempt, "Inspect": Inspect, "Break": Break, "LeaveWaiters": LeaveWaiters,
	}
}

// TestAttemptClaims runs Redlock's grant and rollback scripts on one real
// node in the orders late requests can take: a request of an attempt
// older than the owner's last one there is refused, and a rollback
// deletes only what no later attempt of the owner took or re-acquired.
func TestAttemptClaims(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisConfig{NoPersistence: true})
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer c.Close()
	ctx := context.Background()
	k := Layout{Prefix: "t:"}.Keys("k")
	acquire := func(owner string, fence, attempt int) Acquired {
		t.Helper()
		res, err := AcquireNode.Run(ctx, c, []string{k.Lock, k.Fence, k.Claim}, owner, 60000, fence, attempt).Result()
		if err != nil {
			t.Fatal(err)
		}
		return ParseAcquire(res)
	}
	rollback := func(owner string, attempt int) int64 {
		t.Helper()
		n, err := ReleaseAttempt.Run(ctx, c, []string{k.Lock, k.Claim, k.Waiters}, owner, attempt, k.Channel).Int64()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	lock := func() string { v, _ := c.Get(ctx, k.Lock).Result(); return v }
	steps := []struct {
		what string
		do   func() any
		want any
		lock string
	}{
		{"attempt 5 on a free key", func() any { return acquire("me", 1, 5).Status }, int64(StatusGranted), "1:me"},
		{"attempt 4 lands late", func() any { return acquire("me", 0, 4).Status }, int64(StatusSuperseded), "1:me"},
		{"attempt 4's rollback", func() any { return rollback("me", 4) }, int64(0), "1:me"},
		{"attempt 6 re-acquires, keeping fence 1", func() any { return acquire("me", 2, 6) }, Acquired{Status: StatusAgain, Fence: 1}, "1:me"},
		{"attempt 5's rollback after 6 counted it", func() any { return rollback("me", 5) }, int64(0), "1:me"},
		{"attempt 6's rollback", func() any { return rollback("me", 6) }, int64(1), ""},
		{"attempt 6's own grant, landing after its rollback", func() any { return acquire("me", 3, 6).Status }, int64(StatusSuperseded), ""},
		{"attempt 7", func() any { return acquire("me", 4, 7).Status }, int64(StatusGranted), "4:me"},
		{"another owner's rollback", func() any { return rollback("other", 99) }, int64(0), "4:me"},
		{"another owner's attempt", func() any { return acquire("other", 5, 1).Status }, int64(StatusHeld), "4:me"},
		{"a rollback with no claim of its own deletes an earlier failed attempt's grant", func() any { return rollback("me", 8) }, int64(1), ""},
		{"another owner, after", func() any { return acquire("other", 5, 1).Status }, int64(StatusGranted), "5:other"},
		{"my late attempt 8 is refused by the other owner's grant", func() any { return acquire("me", 6, 8).Status }, int64(StatusHeld), "5:other"},
	}
	for _, s := range steps {
		if got := s.do(); got != s.want {
			t.Fatalf("%s: %+v, want %+v", s.what, got, s.want)
		}
		if l := lock(); l != s.lock {
			t.Fatalf("%s: lock %q, want %q", s.what, l, s.lock)
		}
	}
	c.Set(ctx, k.Claim, "not a claim", 0)
	c.Del(ctx, k.Lock)
	_, err := AcquireNode.Run(ctx, c, []string{k.Lock, k.Fence, k.Claim}, "me", 60000, 9, 9).Result()
	if err == nil || ForeignReply(err, k.Claim) == nil {
		t.Fatalf("grant over a foreign claim: %v, want an error ForeignReply recognises", err)
	}
	if l := lock(); l != "" {
		t.Fatalf("grant over a foreign claim wrote the lock: %q", l)
	}

	// A waiter queue of another type fails the grant of a process with
	// waiters, and a rollback, before either wrote anything.
	c.Del(ctx, k.Claim)
	c.Set(ctx, k.Waiters, "not a queue", 0)
	_, err = AcquireNode.Run(ctx, c, []string{k.Lock, k.Fence, k.Claim, k.Waiters}, "me", 60000, 9, 9, 1, 1000, "p:1").Result()
	if err == nil || ForeignReply(err, k.Waiters) == nil {
		t.Fatalf("grant over a foreign waiter queue: %v, want an error ForeignReply recognises", err)
	}
	if l, cl := lock(), c.Get(ctx, k.Claim).Val(); l != "" || cl != "" {
		t.Fatalf("grant over a foreign waiter queue wrote lock %q, claim %q", l, cl)
	}
	c.Set(ctx, k.Lock, "9:me", 0)
	c.Set(ctx, k.Claim, "9:me", 0)
	_, err = ReleaseAttempt.Run(ctx, c, []string{k.Lock, k.Claim, k.Waiters}, "me", 9, k.Channel).Result()
	if err == nil || ForeignReply(err, k.Waiters) == nil {
		t.Fatalf("rollback over a foreign waiter queue: %v, want an error ForeignReply recognises", err)
	}
	if l, cl := lock(), c.Get(ctx, k.Claim).Val(); l != "9:me" || cl != "9:me" {
		t.Fatalf("rollback over a foreign waiter queue changed lock %q, claim %q", l, cl)
	}
}
