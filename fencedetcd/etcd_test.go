package fencedetcd_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/drivertest"
	"github.com/fenced-dev/fenced/fencedetcd"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
	"github.com/fenced-dev/fenced/recipe/recipetest"
)

// newClient returns an etcd client on the cluster, closed when t ends.
func newClient(t testing.TB, c *testenv.EtcdCluster) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func TestConformance(t *testing.T) {
	cluster := testenv.StartEtcd(t)
	h := drivertest.Harness{
		Open: func(t *testing.T) driver.Driver {
			d, err := fencedetcd.New(newClient(t, cluster), nil)
			if err != nil {
				t.Fatal(err)
			}
			return d
		},
		ShortTTL: time.Second,
		BadURLs: []string{
			"etcd://",
			"etcd:opaque",
			"etcd://127.0.0.1",
			"etcd://127.0.0.1:notaport",
			"etcd://127.0.0.1:2379,:2380",
			"etcd://127.0.0.1:2379/some/path",
			"etcd://127.0.0.1:2379/?unknown=1",
			"etcd://127.0.0.1:2379/?dial_timeout=-1s",
			"etcd://127.0.0.1:2379/?prefix=",
			"etcd://127.0.0.1:2379/?prefix=a;b",
			"etcd://127.0.0.1:2379/?prefix=a&prefix=b",
			"etcd://127.0.0.1:2379/?dial_timeout=%zz",
		},
	}
	drivertest.RunConformanceTests(t, h)
	recipetest.RunConformanceTests(t, h)
}

// TestUnreachable checks that opening a cluster nobody listens on fails
// with a clear error matching ErrUnavailable.
func TestUnreachable(t *testing.T) {
	ctx := context.Background()
	url := fmt.Sprintf("etcd://127.0.0.1:%d,127.0.0.1:%d/?dial_timeout=500ms", testenv.FreePort(t), testenv.FreePort(t))
	_, err := fenced.Open(ctx, url, nil)
	if !errors.Is(err, fenced.ErrUnavailable) || !strings.Contains(err.Error(), "cannot reach etcd") {
		t.Fatalf("Open(%s) = %v, want ErrUnavailable saying it cannot reach etcd", url, err)
	}
}

// TestRenewLongerThanSession checks that a renewal asking for more than
// the session its grant rides on is refused rather than reported done: a
// keep-alive extends the session by its own TTL only, so the grant would
// end before the TTL the caller counts on.
func TestRenewLongerThanSession(t *testing.T) {
	ctx := context.Background()
	d, err := fencedetcd.New(newClient(t, testenv.StartEtcd(t)), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	g := driver.Grant{Key: "k", Owner: "owner-renewing-longer", TTL: 2 * time.Second}
	if g.Fence, err = d.TryAcquire(ctx, g.Key, g.Owner, g.TTL); err != nil {
		t.Fatal(err)
	}
	longer := g
	longer.TTL = time.Minute
	if err := d.Renew(ctx, longer); !errors.Is(err, fenced.ErrInvalidTTL) {
		t.Fatalf("renewal for %v of a grant made for %v: %v, want ErrInvalidTTL", longer.TTL, g.TTL, err)
	}
	if err := d.Renew(ctx, g); err != nil {
		t.Fatalf("renewal for the grant's own TTL: %v", err)
	}
}

// TestLateReleaseOfAReapedGrant checks that a release of a grant the
// driver already ended (reaped after its TTL without renewal) fails with
// ErrNotHeld and leaves alone the next grant of the same name, which the
// same session carries under the same key name; and that the reaped
// grant's fence stays recorded for Inspect although nobody released it.
func TestLateReleaseOfAReapedGrant(t *testing.T) {
	ctx := context.Background()
	cli := newClient(t, testenv.StartEtcd(t))
	d, err := fencedetcd.New(cli, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	const ttl = time.Second
	keysOf := func() []string {
		resp, err := cli.Get(ctx, d.LockName("k")+"/", clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, kv := range resp.Kvs {
			keys = append(keys, fmt.Sprintf("%s@%d", kv.Key, kv.CreateRevision))
		}
		return keys
	}
	a := driver.Grant{Key: "k", Owner: "owner-a-not-renewed", TTL: ttl}
	if a.Fence, err = d.TryAcquire(ctx, a.Key, a.Owner, ttl); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(keysOf()) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the unrenewed grant's key is still there 10s after its %v TTL: %v", ttl, keysOf())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if info, err := d.Inspect(ctx, "k"); err != nil || info.Held || info.Fence != a.Fence {
		t.Fatalf("Inspect after the grant expired: %+v, %v; want free with fence %d", info, err, a.Fence)
	}
	b := driver.Grant{Key: "k", Owner: "owner-b-next-grant", TTL: ttl}
	if b.Fence, err = d.TryAcquire(ctx, b.Key, b.Owner, ttl); err != nil {
		t.Fatal(err)
	}
	if err := d.Release(ctx, a); !errors.Is(err, fenced.ErrNotHeld) {
		t.Fatalf("late release of the expired grant: %v, want ErrNotHeld", err)
	}
	if info, err := d.Inspect(ctx, "k"); err != nil || !info.Held || info.Fence != b.Fence {
		t.Fatalf("after the late release, Inspect = %+v, %v (keys %v); want held with the next grant's fence %d", info, err, keysOf(), b.Fence)
	}
	if err := d.Release(ctx, b); err != nil {
		t.Fatal(err)
	}
	if info, err := d.Inspect(ctx, "k"); err != nil || info.Held || info.Fence != b.Fence {
		t.Fatalf("after release, Inspect = %+v, %v; want free with fence %d", info, err, b.Fence)
	}
}
