package fencedredis_test

import (
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/fencedredis"
	"github.com/fenced-dev/fenced/internal/backend/rediskit"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
	"github.com/fenced-dev/fenced/internal/testkit/waketest"
	"github.com/redis/go-redis/v9"
)

// startCluster starts a Redis Cluster of n primaries (the slots split
// evenly, no replicas) and returns their addresses. Even one node refuses
// a script whose declared keys span hash slots (CROSSSLOT), which is what
// a Cluster client must avoid.
func startCluster(t *testing.T, n int) []string {
	t.Helper()
	ctx := testCtx(t)
	bin := testenv.RequireBinary(t, "redis-server", "redis-server")
	var addrs []string
	var clients []*redis.Client
	for i := 0; i < n; i++ {
		port := testenv.FreePort(t)
		dir := testenv.TempDir(t, "redis-cluster")
		p := testenv.Start(t, fmt.Sprintf("redis-cluster:%d", port), exec.Command(bin,
			"--bind", "127.0.0.1", "--port", strconv.Itoa(port), "--dir", dir, "--save", "", "--appendonly", "no",
			"--daemonize", "no", "--protected-mode", "no", "--logfile", "",
			"--cluster-enabled", "yes", "--cluster-config-file", dir+"/nodes.conf"))
		p.WaitLog(t, "Ready to accept connections", 20*time.Second)
		addrs = append(addrs, testenv.Addr(port))
		c := redis.NewClient(&redis.Options{Addr: addrs[i]})
		defer c.Close()
		clients = append(clients, c)
		from, to := i*16384/n, (i+1)*16384/n-1
		if err := c.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", from, to).Err(); err != nil {
			t.Fatal(err)
		}
		if i > 0 {
			if err := clients[0].ClusterMeet(ctx, "127.0.0.1", strconv.Itoa(port)).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, c := range clients {
		waitFor(t, "cluster state ok", func() bool {
			s, err := c.ClusterInfo(ctx).Result()
			return err == nil && strings.Contains(s, "cluster_state:ok") && strings.Contains(s, fmt.Sprintf("cluster_known_nodes:%d", n))
		})
	}
	return addrs
}

// nodeScriptCalls sums the script calls the nodes at addrs have run.
func nodeScriptCalls(t *testing.T, addrs []string) int64 {
	t.Helper()
	var n int64
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		n += scriptCalls(t, c)
		c.Close()
	}
	return n
}

// TestCluster runs grants, releases and batch renewals of keys in many
// hash slots through a ClusterClient on three primaries: a batch costs
// one script call per node and RenewChunk grants, and a grant the
// cross-slot script cannot renew (a key of another type here) is tried
// again by the one-slot script and reported alone.
func TestCluster(t *testing.T) {
	ctx := testCtx(t)
	addrs := startCluster(t, 3)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, MaxRetries: -1})
	defer cc.Close()
	d, err := fencedredis.New(cc, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	var grants []driver.Grant
	for i := 0; i < 600; i++ {
		k, o := fmt.Sprintf("cluster:%d", i), owner()
		f, err := d.TryAcquire(ctx, k, o, time.Minute)
		if err != nil {
			t.Fatalf("acquire %s: %v", k, err)
		}
		grants = append(grants, driver.Grant{Key: k, Owner: o, Fence: f, TTL: 3 * time.Minute})
	}
	// A refused try of a subscribed process sets the waiters mark, in the
	// lock's slot.
	sub, err := d.Subscribe(ctx, "cluster:0")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if _, err := d.TryAcquire(ctx, "cluster:0", owner(), time.Minute); !errors.Is(err, fenced.ErrHeld) {
		t.Fatalf("try of a held key: %v", err)
	}
	grants[7].Fence++                                        // stale
	if _, err := d.RenewBatch(ctx, grants[:1]); err != nil { // load the scripts
		t.Fatal(err)
	}
	before := nodeScriptCalls(t, addrs)
	errs, err := d.RenewBatch(ctx, grants)
	if err != nil {
		t.Fatal(err)
	}
	if calls := nodeScriptCalls(t, addrs) - before; calls != 3 {
		t.Errorf("a batch of 600 grants on 3 nodes ran %d script calls, want 3", calls)
	}
	for i, e := range errs {
		if (i == 7) != errors.Is(e, fenced.ErrNotHeld) || (i != 7 && e != nil) {
			t.Fatalf("grant %d: %v", i, e)
		}
	}
	// A key of another type: the cross-slot script reports it, the
	// one-slot script is tried and reports it too; the rest is renewed.
	foreign := rediskit.Layout{Prefix: rediskit.DefaultPrefix}.Keys(grants[9].Key).Lock
	if err := cc.Del(ctx, foreign).Err(); err != nil {
		t.Fatal(err)
	}
	if err := cc.HSet(ctx, foreign, "someone", "else").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rediskit.RenewMany.Load(ctx, cc).Err(); err != nil { // not run yet
		t.Fatal(err)
	}
	before = nodeScriptCalls(t, addrs)
	errs, err = d.RenewBatch(ctx, grants)
	if err != nil {
		t.Fatal(err)
	}
	if calls := nodeScriptCalls(t, addrs) - before; calls != 4 {
		t.Errorf("a batch with one foreign key ran %d script calls, want 4 (3 nodes, then its slot)", calls)
	}
	for i, e := range errs {
		switch {
		case i == 9:
			if !errors.Is(e, fencedredis.ErrForeignValue) || errors.Is(e, fenced.ErrNotHeld) {
				t.Errorf("grant %d on a key of another type: %v, want ErrForeignValue and not ErrNotHeld", i, e)
			}
		case (i == 7) != errors.Is(e, fenced.ErrNotHeld) || (i != 7 && e != nil):
			t.Fatalf("grant %d: %v", i, e)
		}
	}
	if err := cc.Del(ctx, foreign).Err(); err != nil {
		t.Fatal(err)
	}
	grants = append(grants[:9], grants[10:]...)
	info, err := d.Inspect(ctx, "cluster:599")
	if err != nil || info.Remaining < 2*time.Minute {
		t.Fatalf("after the batch, cluster:599 = %+v, %v; want renewed for 3m", info, err)
	}
	grants[7].Fence--
	for _, g := range grants {
		if err := d.Release(ctx, g); err != nil {
			t.Fatalf("release %v: %v", g, err)
		}
	}
	if !waketest.Woken(sub, 10*time.Second) {
		t.Fatal("the release of cluster:0 did not wake its refused waiter")
	}
}

// Lease keys with braces work on Redis Cluster: every name of a key (lock,
// counter, waiter queue, audit stream) hashes to one slot, as the server
// computes it (CLUSTER KEYSLOT; rediskit.HashSlot agrees), and grants,
// refusals that enter the waiter queue, releases that wake, breaks and
// List all run. A key starting with '}' used to give its names an empty
// hash tag, so Redis hashed each whole name and every script failed with
// CROSSSLOT.
func TestClusterKeysWithBraces(t *testing.T) {
	ctx := testCtx(t)
	addrs := startCluster(t, 3)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, MaxRetries: -1})
	defer cc.Close()
	d, err := fencedredis.New(cc, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	node := redis.NewClient(&redis.Options{Addr: addrs[0]})
	defer node.Close()
	layout := rediskit.Layout{Prefix: rediskit.DefaultPrefix, Cluster: true}
	for _, key := range []string{"}a", "{}x", "a{b}c", "{{a}}", "}", "}}x", "a}", "{", "x{"} {
		k := layout.Keys(key)
		var slots []int64
		for _, name := range []string{k.Lock, k.Fence, k.Audit, k.Waiters, k.Claim} {
			slot, err := node.ClusterKeySlot(ctx, name).Result()
			if err != nil {
				t.Fatal(err)
			}
			if uint16(slot) != rediskit.HashSlot(name) {
				t.Errorf("HashSlot(%q) = %d, CLUSTER KEYSLOT says %d", name, rediskit.HashSlot(name), slot)
			}
			slots = append(slots, slot)
		}
		for _, s := range slots[1:] {
			if s != slots[0] {
				t.Errorf("key %q: its names hash to slots %v, want one", key, slots)
				break
			}
		}
		o := owner()
		f, err := d.TryAcquire(ctx, key, o, time.Minute)
		if err != nil {
			t.Errorf("key %q: acquire: %v", key, err)
			continue
		}
		sub, err := d.Subscribe(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.TryAcquire(ctx, key, owner(), time.Minute); !errors.Is(err, fenced.ErrHeld) {
			t.Errorf("key %q: try of the held key: %v, want ErrHeld", key, err)
		}
		infos, err := d.List(ctx, key)
		if err != nil || len(infos) == 0 || infos[0].Key != key {
			t.Errorf("key %q: List(%q) = %+v, %v; want the key first", key, key, infos, err)
		}
		if err := d.Release(ctx, driver.Grant{Key: key, Owner: o, Fence: f, TTL: time.Minute}); err != nil {
			t.Errorf("key %q: release: %v", key, err)
		} else if !waketest.Woken(sub, 10*time.Second) {
			t.Errorf("key %q: the release did not wake the refused waiter", key)
		}
		sub.Close()
		if f2, err := d.TryAcquire(ctx, key, o, time.Minute); err != nil || f2 <= f {
			t.Errorf("key %q: acquire again: fence %d, %v; want above %d", key, f2, err, f)
		}
		if _, err := d.Break(ctx, key, "test", "test"); err != nil {
			t.Errorf("key %q: break: %v", key, err)
		}
	}
}
