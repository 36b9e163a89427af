package fencedredis_test

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/fencedredis"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
	"github.com/redis/go-redis/v9"
)

func admin(t testing.TB, srv *testenv.Redis) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Password: srv.Config.Password, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	return c
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// waitFor polls cond every 20ms for up to 10s.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// promote kills the primary, lets the replica run again and makes it a
// primary, as Sentinel would after an asynchronous failover.
func promote(t testing.TB, ctx context.Context, primary, replica *testenv.Redis) {
	t.Helper()
	primary.Kill() // kill -9: whatever it did not send is gone
	if err := replica.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if err := admin(t, replica).Do(ctx, "REPLICAOF", "NO", "ONE").Err(); err != nil {
		t.Fatalf("promote replica: %v", err)
	}
}

// TestFailoverRepeatsFence reproduces the hazard the Capabilities declare
// (FenceRepeatable): the primary grants a lease, replication never carries
// it, the primary dies and its replica is promoted; a second client is then
// granted the same key with the same fence while the first still believes
// it holds the lease. No resource can tell the two holders apart by fence.
// With WaitReplicas, the grant that could not be replicated is refused
// instead of handed out.
func TestFailoverRepeatsFence(t *testing.T) {
	ctx := testCtx(t)
	primary := testenv.StartRedis(t, testenv.RedisConfig{})
	replica := testenv.StartRedis(t, testenv.RedisConfig{ReplicaOf: primary})
	key := "invoice:inv_72"
	d := newDriver(t, primary, nil)
	if g := d.Capabilities(); g.Fence != fenced.FenceRepeatable || !strings.Contains(g.Note, "failover") {
		t.Fatalf("Capabilities = %+v: the fence must be declared repeatable after failover, with a note saying so", g)
	}

	// Three grants that did reach the replica.
	var last uint64
	for i := 0; i < 3; i++ {
		o := owner()
		f, err := d.TryAcquire(ctx, key, o, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Release(ctx, driver.Grant{Key: key, Owner: o, Fence: f}); err != nil {
			t.Fatal(err)
		}
		last = f
	}
	rc := admin(t, replica)
	waitFor(t, "the replica to catch up", func() bool {
		v, _ := rc.Get(ctx, "fenced:{"+key+"}:fence").Uint64()
		n, _ := rc.Exists(ctx, "fenced:{"+key+"}:lock").Result()
		return v == last && n == 0
	})

	// The replica stops receiving: it is paused and its link is cut, so
	// nothing written from now on reaches it.
	if err := replica.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if err := admin(t, primary).ClientKillByFilter(ctx, "TYPE", "replica").Err(); err != nil {
		t.Fatal(err)
	}

	// With WaitReplicas, a grant the replica did not acknowledge is taken
	// back and reported, so no caller works under it.
	dw := newDriver(t, primary, &fencedredis.Options{WaitReplicas: 1, WaitTimeout: 300 * time.Millisecond})
	_, err := dw.TryAcquire(ctx, "invoice:inv_73", owner(), time.Minute)
	if !errors.Is(err, fenced.ErrUnavailable) || !strings.Contains(err.Error(), "0 of 1 replicas") {
		t.Fatalf("grant with WaitReplicas=1 and the replica cut off: %v, want ErrUnavailable naming 0 of 1 replicas", err)
	}
	if info, err := dw.Inspect(ctx, "invoice:inv_73"); err != nil || info.Held {
		t.Fatalf("unacknowledged grant left in place: %+v, %v", info, err)
	}
	t.Logf("with WAIT: %v", err)

	// Without WAIT, A is granted on the primary only.
	fa, err := d.TryAcquire(ctx, key, owner(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if fa != last+1 {
		t.Fatalf("A's fence %d, want %d", fa, last+1)
	}
	promote(t, ctx, primary, replica)

	// B asks the promoted replica: the key is free there, and the counter
	// has not seen A's grant.
	db := newDriver(t, replica, nil)
	fb, err := db.TryAcquire(ctx, key, owner(), time.Minute)
	if err != nil {
		t.Fatalf("B on the promoted replica: %v (the hazard did not reproduce)", err)
	}
	t.Logf("A holds fence %d on the dead primary; B was granted fence %d on the promoted replica", fa, fb)
	if fb != fa {
		t.Fatalf("B's fence %d, want A's fence %d repeated: the declared hazard (FenceRepeatable) is exactly this", fb, fa)
	}
}

// TestFailoverAfterWaitKeepsGrant shows what WaitReplicas fixes: a grant
// acknowledged by the replica survives the primary's death, so the
// promoted replica refuses a second holder and the next fence is higher.
func TestFailoverAfterWaitKeepsGrant(t *testing.T) {
	ctx := testCtx(t)
	primary := testenv.StartRedis(t, testenv.RedisConfig{})
	replica := testenv.StartRedis(t, testenv.RedisConfig{ReplicaOf: primary})
	key := "invoice:inv_74"
	d := newDriver(t, primary, &fencedredis.Options{WaitReplicas: 1, WaitTimeout: 5 * time.Second})
	if g := d.Capabilities(); g.Fence != fenced.FenceRepeatable || !strings.Contains(g.Note, "WAIT") {
		t.Fatalf("Capabilities with WaitReplicas = %+v: still repeatable, and the note must mention WAIT", g)
	}
	fa, err := d.TryAcquire(ctx, key, owner(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	promote(t, ctx, primary, replica) // at once: no time to replicate beyond what WAIT confirmed
	db := newDriver(t, replica, nil)
	if _, err := db.TryAcquire(ctx, key, owner(), time.Minute); !errors.Is(err, fenced.ErrHeld) {
		t.Fatalf("B on the promoted replica: %v, want ErrHeld (A's acknowledged grant survives)", err)
	}
	if _, err := db.Break(ctx, key, "A's primary died", "test"); err != nil {
		t.Fatal(err)
	}
	fb, err := db.TryAcquire(ctx, key, owner(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if fb <= fa {
		t.Fatalf("fence after failover %d, want > %d", fb, fa)
	}
}

// TestRestart shows both halves of the declared guarantee on one node:
// with the append-only file fsynced on every write the counter survives
// kill -9, and without persistence it starts over and fences repeat.
func TestRestart(t *testing.T) {
	for _, tc := range []struct {
		name    string
		persist bool
	}{{"AOFAlways", true}, {"NoPersistence", false}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			srv := testenv.StartRedis(t, testenv.RedisConfig{NoPersistence: !tc.persist})
			key := "job:nightly"
			d := newDriver(t, srv, nil)
			var f1 uint64
			for i := 0; i < 3; i++ {
				o := owner()
				f, err := d.TryAcquire(ctx, key, o, time.Minute)
				if err != nil {
					t.Fatal(err)
				}
				if i < 2 {
					d.Release(ctx, driver.Grant{Key: key, Owner: o, Fence: f})
				}
				f1 = f
			}
			srv.Kill()
			srv = srv.Restart(t)
			d2 := newDriver(t, srv, nil)
			f2, err := d2.TryAcquire(ctx, key, owner(), time.Minute)
			if tc.persist {
				if !errors.Is(err, fenced.ErrHeld) {
					t.Fatalf("after kill -9 and restart: %v, want the held grant kept (ErrHeld)", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if f2 > f1 {
				t.Fatalf("without persistence the restarted server issued fence %d after %d; the test expected the documented repeat", f2, f1)
			}
			t.Logf("without persistence: fence %d issued again after %d (documented hazard)", f2, f1)
		})
	}
}

// TestCorrectnessLeaseNeedsConsent checks the error a correctness lease
// gets, which must tell the user what the hazard is and how to accept it.
func TestCorrectnessLeaseNeedsConsent(t *testing.T) {
	ctx := testCtx(t)
	srv := testenv.StartRedis(t, testenv.RedisConfig{})
	c := fenced.NewClient(newDriver(t, srv, nil), nil)
	defer c.Close()
	_, err := c.TryAcquire(ctx, "ledger:append", nil)
	if !errors.Is(err, fenced.ErrNoFence) {
		t.Fatalf("strict lease without consent: %v, want ErrNoFence", err)
	}
	for _, want := range []string{"repeatable-after-failover", "failover", "restart without persistence", "FenceRepeatable", "FenceNone"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	t.Logf("refusal reads: %v", err)
	l, err := c.TryAcquire(ctx, "ledger:append", &fenced.LeaseOptions{MinFence: fenced.FenceRepeatable})
	if err != nil {
		t.Fatal(err)
	}
	l.Release(ctx)
	l, err = c.TryAcquire(ctx, "cache:warm", &fenced.LeaseOptions{MinFence: fenced.FenceNone})
	if err != nil {
		t.Fatal(err)
	}
	l.Release(ctx)
}
