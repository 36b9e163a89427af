package redis_test

import (
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
	fredis "github.com/fenced-dev/fenced/redis"
	"github.com/redis/go-redis/v9"
)

// startCluster starts a one-node Redis Cluster (every slot on one
// primary): enough for the server to refuse a script whose keys span hash
// slots (CROSSSLOT), which is what a Cluster client must avoid.
func startCluster(t *testing.T) string {
	t.Helper()
	bin := testenv.RequireBinary(t, "redis-server", "redis-server")
	port := testenv.FreePort(t)
	dir := testenv.TempDir(t, "redis-cluster")
	p := testenv.Start(t, fmt.Sprintf("redis-cluster:%d", port), exec.Command(bin,
		"--bind", "127.0.0.1", "--port", strconv.Itoa(port), "--dir", dir, "--save", "", "--appendonly", "no",
		"--daemonize", "no", "--protected-mode", "no", "--logfile", "",
		"--cluster-enabled", "yes", "--cluster-config-file", dir+"/nodes.conf"))
	p.WaitLog(t, "Ready to accept connections", 20*time.Second)
	addr := testenv.Addr(port)
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	ctx := testCtx(t)
	if err := c.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "cluster state ok", func() bool {
		s, err := c.ClusterInfo(ctx).Result()
		return err == nil && strings.Contains(s, "cluster_state:ok")
	})
	return addr
}

// TestCluster runs grants, releases and a batch renewal of keys in many
// hash slots through a ClusterClient: every script's keys share one slot.
func TestCluster(t *testing.T) {
	ctx := testCtx(t)
	addr := startCluster(t)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}, MaxRetries: -1})
	defer cc.Close()
	d, err := fredis.New(cc, nil)
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
	if _, err := d.TryAcquire(ctx, "cluster:0", owner(), time.Minute); !errors.Is(err, driver.ErrHeld) {
		t.Fatalf("try of a held key: %v", err)
	}
	grants[7].Fence++ // stale
	errs, err := d.RenewBatch(ctx, grants)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range errs {
		if (i == 7) != errors.Is(e, driver.ErrNotHeld) || (i != 7 && e != nil) {
			t.Fatalf("grant %d: %v", i, e)
		}
	}
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
	if !woken(sub, 10*time.Second) {
		t.Fatal("the release of cluster:0 did not wake its refused waiter")
	}
}
