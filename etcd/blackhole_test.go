package etcd_test

import (
	"context"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver/drivertest"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// TestBlackHoleEndsLeasesAtValidity holds 10 000 leases on etcd through a
// proxy that turns into a black hole (connections open, nothing through):
// the driver's loss-watch stops then block on a full stream, and still
// every lease's context is cancelled at its local validity.
func TestBlackHoleEndsLeasesAtValidity(t *testing.T) {
	cluster := testenv.StartEtcd(t)
	proxy := testenv.StartProxy(t, cluster.Endpoints()[0])
	c, err := fenced.Open(context.Background(), "etcd://"+proxy.Addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	drivertest.CheckEndsThroughBlackHole(t, c, 10000, 4*time.Second, proxy.BlackHole)
}
