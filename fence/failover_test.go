package fence_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fence"
	"github.com/fenced-dev/fenced/fencedredis"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// TestRepeatedFenceAfterFailoverRefused: a Redis lease store with an
// asynchronous replica fails over after granting fence N that never reached
// the replica, so the promoted replica grants the same fence N to a second
// holder. Both now present fence N. The guard records the owner beside the
// fence, so the holder that did not write first is refused instead of
// interleaving its writes with the other's.
// failoverLease is a minute's lease that is never renewed.
var failoverLease = &fenced.LeaseOptions{TTL: time.Minute, ManualRenew: true}

func TestRepeatedFenceAfterFailoverRefused(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	primary := testenv.StartRedis(t, testenv.RedisConfig{})
	replica := testenv.StartRedis(t, testenv.RedisConfig{ReplicaOf: primary})
	adminP := redis.NewClient(&redis.Options{Addr: primary.Addr(), MaxRetries: -1})
	defer adminP.Close()
	adminR := redis.NewClient(&redis.Options{Addr: replica.Addr(), MaxRetries: -1})
	defer adminR.Close()
	leaseClient := func(srv *testenv.Redis) *fenced.Client {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		d, err := fencedredis.New(c, nil)
		if err != nil {
			t.Fatal(err)
		}
		lc := fenced.NewClient(d, &fenced.Options{MinFence: fenced.FenceRepeatable})
		t.Cleanup(func() { lc.Close() })
		return lc
	}
	onPrimary := leaseClient(primary)

	// The resource: a SQLite table guarded by the fence.
	e := sqlEnv{db: openSQLite(t), d: fence.SQLite}
	table := e.jobsTable(t, "inv_72")
	var stale []fenced.Event
	g := e.guard(t, table, func(ev fenced.Event) {
		if ev.Kind == fenced.EventStaleWrite {
			stale = append(stale, ev)
		}
	})

	// A few grants that do reach the replica.
	for i := 0; i < 3; i++ {
		l, err := onPrimary.TryAcquire(ctx, pauseKey, failoverLease)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := adminP.Wait(ctx, 1, 10*time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("replica did not acknowledge: %d %v", n, err)
	}
	// Cut the replica off, grant A on the primary only, fail over.
	if err := replica.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if err := adminP.ClientKillByFilter(ctx, "TYPE", "replica").Err(); err != nil {
		t.Fatal(err)
	}
	a, err := onPrimary.TryAcquire(ctx, pauseKey, failoverLease)
	if err != nil {
		t.Fatal(err)
	}
	ta := fence.From(a)
	if r, err := e.send(ctx, g, nil, "inv_72", ta); err != nil || !r.Applied() {
		t.Fatalf("A's send: %+v %v", r, err)
	}
	primary.Kill()
	if err := replica.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if err := adminR.Do(ctx, "REPLICAOF", "NO", "ONE").Err(); err != nil {
		t.Fatal(err)
	}
	b, err := leaseClient(replica).TryAcquire(ctx, pauseKey, failoverLease)
	if err != nil {
		t.Fatalf("B on the promoted replica: %v", err)
	}
	tb := fence.From(b)
	if tb.Fence != ta.Fence {
		t.Fatalf("fences A=%d B=%d: the failover did not repeat the fence, so this test proves nothing", ta.Fence, tb.Fence)
	}
	t.Logf("A and B both hold fence %d (owners %s, %s)", ta.Fence, ta.Owner[:8], tb.Owner[:8])

	// B's claim and writes are refused: the row records A's owner at that fence.
	r, err := g.Claim(ctx, nil, "inv_72", tb)
	if err != nil || r.Outcome != fence.Stale || !r.SameFenceOtherOwner {
		t.Fatalf("B's claim: %+v %v, want Stale with SameFenceOtherOwner", r, err)
	}
	r, err = e.note(ctx, g, nil, "inv_72", tb, "B")
	if err != nil || r.Outcome != fence.Stale {
		t.Fatalf("B's write: %+v %v", r, err)
	}
	if got := e.row(t, table, "inv_72"); got.sends != 1 || got.owner != ta.Owner || got.note.Valid {
		t.Fatalf("row %+v: want only A's send", got)
	}
	if len(stale) != 2 || stale[0].Fence != ta.Fence || stale[0].Current != ta.Fence {
		t.Fatalf("stale reports %+v", stale)
	}
}
