package fencedetcd_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/connectivity"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/drivertest"
	"github.com/fenced-dev/fenced/fencedetcd"
	"github.com/fenced-dev/fenced/internal/core/rootaccess"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// openThroughProxy starts etcd and a proxy to it, and opens a client
// through the proxy.
func openThroughProxy(t *testing.T) (*testenv.EtcdCluster, *testenv.Proxy, *fenced.Client) {
	t.Helper()
	cluster := testenv.StartEtcd(t)
	proxy := testenv.StartProxy(t, cluster.Endpoints()[0])
	c, err := fenced.Open(context.Background(), "etcd://"+proxy.Addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return cluster, proxy, c
}

// TestBlackHoleEndsLeasesAtValidity holds 10 000 leases (2 000 under the
// race detector) on etcd through a proxy that turns into a black hole
// (connections open, nothing through): every lease's context is still
// cancelled at its local validity, whatever the driver's requests, loss
// watches and reaper are doing meanwhile.
func TestBlackHoleEndsLeasesAtValidity(t *testing.T) {
	if testing.Short() {
		t.Skip("long: black-holes etcd past the validity; run without -short")
	}
	_, proxy, c := openThroughProxy(t)
	drivertest.CheckEndsThroughBlackHole(t, c, 10000, 4*time.Second, proxy.BlackHole)
}

// TestKeepAliveDropsBlackHoledConnection checks that the client fenced
// builds from a URL gives up a connection that stopped answering without
// closing (gRPC keepalive): within KeepAliveTime+KeepAliveTimeout (plus
// slack) of the black hole, the connection is no longer Ready.
func TestKeepAliveDropsBlackHoledConnection(t *testing.T) {
	if testing.Short() {
		t.Skip("long: black-holes the connection past the keepalive; run without -short")
	}
	_, proxy, c := openThroughProxy(t)
	// A held lease keeps streams open (keepalive pings only while there
	// are).
	if _, err := c.TryAcquire(context.Background(), "keepalive", &fenced.LeaseOptions{TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	conn := rootaccess.Driver(c).(*fencedetcd.Driver).Client().ActiveConnection()
	if s := conn.GetState(); s != connectivity.Ready {
		t.Fatalf("connection %v before the black hole", s)
	}
	proxy.BlackHole(true)
	defer proxy.BlackHole(false)
	cut := time.Now()
	limit := fencedetcd.KeepAliveTime + fencedetcd.KeepAliveTimeout + 5*time.Second
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	for conn.GetState() == connectivity.Ready {
		if !conn.WaitForStateChange(ctx, connectivity.Ready) {
			t.Fatalf("the connection is still Ready %v after the black hole began: no keepalive", limit)
		}
	}
	t.Logf("black-holed connection left Ready after %v (now %v)", time.Since(cut).Round(time.Millisecond), conn.GetState())
}
