package fencedzookeeper_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/drivertest"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// TestBlackHoleEndsLeasesAtValidity holds 10 000 leases (2 000 under the
// race detector) on ZooKeeper through a proxy that turns into a black hole
// (connections open, nothing through): every lease's context is still
// cancelled at its local validity, whatever the driver's calls do
// meanwhile.
func TestBlackHoleEndsLeasesAtValidity(t *testing.T) {
	if testing.Short() {
		t.Skip("long: black-holes ZooKeeper past the validity; run without -short")
	}
	ens := testenv.StartZooKeeper(t)
	proxy := testenv.StartProxy(t, ens.Servers()[0])
	url := strings.Replace(ens.URL("/blackhole", ""), ens.Servers()[0], proxy.Addr, 1)
	c, err := fenced.Open(context.Background(), url, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	drivertest.CheckEndsThroughBlackHole(t, c, 10000, 4*time.Second, proxy.BlackHole)
}
