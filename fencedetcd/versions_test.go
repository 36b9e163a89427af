package fencedetcd_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// TestServerLeaseBehaviour checks, on the etcd the suite runs (Debian's
// 3.4.23, or the 3.6 or 3.7 build that scripts/test.sh names with
// FENCED_ETCD_DIR), the server behaviour the driver's sessions rely on.
// 3.4.23, 3.6.17 and 3.7.4 behave alike in each: a grant below the
// server's minimum TTL is raised, not refused; a keep-alive of a revoked
// lease says the lease is not found (the driver's renewal takes that as
// the grant's loss); a lease and its keys survive a kill -9 and restart of
// the member, which gives the lease its whole TTL again (the driver's
// validity runs on its own clock from the grant or renewal, so a longer
// server-side life only delays a takeover, never allows an early one).
//
// Where the versions differ, it is in races this test cannot make happen
// on demand, and the driver does not depend on either side of them: etcd
// before 3.4.38 (so Debian's 3.4.23) may report a keep-alive that raced a
// revoke as successful, and before 3.5.3 an isolated leader may renew a
// lease until it steps down; the driver ends a grant at its local
// validity whatever a renewal answered later than that, and the fault
// tests (TestFaults, TestBlackHoleEndsLeasesAtValidity) run on every
// version.
func TestServerLeaseBehaviour(t *testing.T) {
	v := testenv.EtcdVersion(t)
	cluster := testenv.StartEtcd(t)
	cli := newClient(t, cluster)
	ctx := context.Background()

	// The server is the one the binary says: FENCED_ETCD_DIR took effect.
	st, err := cli.Status(ctx, cluster.Members[0].Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch); st.Version != want {
		t.Fatalf("the server reports version %s, its binary %s", st.Version, want)
	}
	t.Logf("server: %v", v)

	g, err := cli.Grant(ctx, 1)
	if err != nil {
		t.Fatalf("%v: Grant(1s): %v, want a lease of at least the server's minimum TTL", v, err)
	}
	if g.TTL < 1 {
		t.Fatalf("%v: Grant(1s) gave TTL %ds", v, g.TTL)
	}
	if _, err := cli.Revoke(ctx, g.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.KeepAliveOnce(ctx, g.ID); !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		t.Fatalf("%v: keep-alive of a revoked lease: %v, want %v", v, err, rpctypes.ErrLeaseNotFound)
	}
	if ttl, err := cli.TimeToLive(ctx, g.ID); err != nil || ttl.TTL > 0 {
		t.Fatalf("%v: TimeToLive of a revoked lease: %v, %v; want no TTL left", v, ttl, err)
	}

	g, err = cli.Grant(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, "k", "v", clientv3.WithLease(g.ID)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // some of the TTL runs out before the restart
	before, err := cli.TimeToLive(ctx, g.ID)
	if err != nil {
		t.Fatal(err)
	}
	m := cluster.Members[0]
	m.Kill()
	m.Start()
	m.WaitReady()
	var after *clientv3.LeaseTimeToLiveResponse
	deadline := time.Now().Add(30 * time.Second) // only catches a hang: the member is up
	for {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		after, err = cli.TimeToLive(rctx, g.ID, clientv3.WithAttachedKeys())
		cancel()
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("%v: TimeToLive after the restart: %v", v, err)
	}
	if after.TTL < before.TTL || len(after.Keys) != 1 {
		t.Fatalf("%v: after a restart the lease has %ds left (%ds before) and %d keys, want its TTL again and its key",
			v, after.TTL, before.TTL, len(after.Keys))
	}
}
