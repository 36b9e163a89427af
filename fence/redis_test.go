package fence_test

import (
	"context"
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/fenced-dev/fenced/fence"
	"github.com/fenced-dev/fenced/fence/redisfence"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

type redisKV struct {
	g *redisfence.Guard
	c *redis.Client
}

func (r redisKV) claim(ctx context.Context, res string, t fence.Token) (fence.Result, error) {
	return r.g.Claim(ctx, res, t)
}

func (r redisKV) put(ctx context.Context, res string, t fence.Token, note, ifStatus, newStatus string) (fence.Result, error) {
	w := redisfence.Write{Set: []string{"note", note}}
	if ifStatus != "" {
		w.If = []string{"status", ifStatus}
		w.Set = append(w.Set, "status", newStatus)
	}
	return r.g.Write(ctx, res, t, w)
}

func (r redisKV) setStatus(ctx context.Context, res string, t fence.Token, status string) error {
	_, err := r.g.Write(ctx, res, t, redisfence.Write{Set: []string{"status", status}})
	return err
}

func (r redisKV) note(ctx context.Context, res string) string {
	return r.c.HGet(ctx, res, "note").Val()
}

func (r redisKV) status(ctx context.Context, res string) string {
	return r.c.HGet(ctx, res, "status").Val()
}

func (r redisKV) current(ctx context.Context, res string) (uint64, string) {
	v := r.c.HMGet(ctx, res, "fence", "fence_owner").Val()
	f, _ := v[0].(string)
	o, _ := v[1].(string)
	var n uint64
	for _, c := range f {
		n = n*10 + uint64(c-'0')
	}
	return n, o
}

func TestRedisGuard(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t, testenv.RedisConfig{})
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { c.Close() })
	runKVGuardTests(t, func(t *testing.T, o kvOpts) kvGuard {
		g, err := redisfence.New(c, &redisfence.Options{Hook: o.hooks, Check: o.check, LeaseKey: o.leaseKey})
		if err != nil {
			t.Fatal(err)
		}
		return redisKV{g, c}
	})

	t.Run("BadInput", func(t *testing.T) {
		ctx := context.Background()
		g, _ := redisfence.New(c, nil)
		// A fence field that is not a fence: refused, nothing changed.
		c.HSet(ctx, "corrupt", "fence", "-3", "note", "x")
		if _, err := g.Write(ctx, "corrupt", tok(5, "o"), redisfence.Write{Set: []string{"note", "y"}}); !errors.Is(err, fence.ErrSchema) {
			t.Errorf("corrupt fence field: %v", err)
		}
		c.HSet(ctx, "corrupt2", "fence", "99999999999999999999999", "note", "x")
		if _, err := g.Write(ctx, "corrupt2", tok(5, "o"), redisfence.Write{Set: []string{"note", "y"}}); !errors.Is(err, fence.ErrSchema) {
			t.Errorf("overflowing fence field: %v", err)
		}
		if c.HGet(ctx, "corrupt", "note").Val() != "x" || c.HGet(ctx, "corrupt2", "note").Val() != "x" {
			t.Error("corrupt hashes changed")
		}
		// A key of another type.
		c.Set(ctx, "a-string", "v", 0)
		if _, err := g.Claim(ctx, "a-string", tok(5, "o")); err == nil || c.Get(ctx, "a-string").Val() != "v" {
			t.Errorf("string key: %v", err)
		}
		// Odd pairs and writes to the guard's own fields.
		if _, err := g.Write(ctx, "h", tok(5, "o"), redisfence.Write{Set: []string{"note"}}); !errors.Is(err, fence.ErrInvalidToken) {
			t.Errorf("odd Set: %v", err)
		}
		if _, err := g.Write(ctx, "h", tok(5, "o"), redisfence.Write{Set: []string{"fence", "999"}}); err == nil {
			t.Error("Set of the fence field accepted")
		}
		if n := c.Exists(ctx, "h").Val(); n != 0 {
			t.Error("refused writes created the hash")
		}
		if _, err := redisfence.New(c, &redisfence.Options{FenceField: "x", OwnerField: "x"}); !errors.Is(err, fence.ErrSchema) {
			t.Errorf("same field names: %v", err)
		}
		if _, err := redisfence.New(c, &redisfence.Options{KeyField: "fence"}); !errors.Is(err, fence.ErrSchema) {
			t.Errorf("key field named like the fence field: %v", err)
		}
		if _, err := g.Write(ctx, "h", tok(5, "o"), redisfence.Write{Set: []string{"fence_key", "batch:all"}}); err == nil {
			t.Error("Set of the key field accepted")
		}
	})

	// A hash guarded before keys were recorded has no key field: the next
	// admitted write binds it, and then other keys are refused.
	t.Run("UnboundHash", func(t *testing.T) {
		ctx := context.Background()
		g, _ := redisfence.New(c, nil)
		c.HSet(ctx, "legacy", "fence", "5", "fence_owner", "o5", "note", "x")
		if r, err := g.Write(ctx, "legacy", fence.Token{Key: "invoice:1", Fence: 4, Owner: "o4"}, redisfence.Write{Set: []string{"note", "stale"}}); err != nil || r.Outcome != fence.Stale {
			t.Fatalf("older fence on an unbound hash: %+v %v", r, err)
		}
		if c.HExists(ctx, "legacy", "fence_key").Val() {
			t.Fatal("a refused write bound the hash")
		}
		if r, err := g.Write(ctx, "legacy", fence.Token{Key: "invoice:1", Fence: 6, Owner: "o6"}, redisfence.Write{Set: []string{"note", "y"}}); err != nil || !r.Applied() {
			t.Fatalf("newer fence on an unbound hash: %+v %v", r, err)
		}
		if k := c.HGet(ctx, "legacy", "fence_key").Val(); k != "invoice:1" {
			t.Fatalf("bound to %q, want invoice:1", k)
		}
		if _, err := g.Write(ctx, "legacy", fence.Token{Key: "batch:all", Fence: 900, Owner: "b"}, redisfence.Write{Set: []string{"note", "z"}}); !errors.Is(err, fence.ErrWrongKey) {
			t.Fatalf("other key after binding: %v", err)
		}
	})
}
