package zookeeper_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/driver/drivertest"
	"github.com/fenced-dev/fenced/internal/faulttest"
	"github.com/fenced-dev/fenced/internal/testenv"
	_ "github.com/fenced-dev/fenced/zookeeper"
)

// openDriver opens a driver by URL, as fenced.Open would.
func openDriver(t testing.TB, url string) driver.Driver {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := fenced.Open(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c.Driver()
}

// TestZooKeeper runs everything that needs a standalone server under one
// server, since a JVM takes seconds to start.
func TestZooKeeper(t *testing.T) {
	zk := testenv.StartZooKeeper(t)
	t.Run("Conformance", func(t *testing.T) {
		drivertest.RunConformanceTests(t, drivertest.Harness{
			Open: func(t *testing.T) driver.Driver {
				return openDriver(t, zk.URL("/conformance", ""))
			},
			ShortTTL: 500 * time.Millisecond,
			BadURLs: []string{
				"zk://",
				"zk:opaque",
				"zk://127.0.0.1",
				"zk://127.0.0.1:notaport/x",
				"zk://user:pw@127.0.0.1:2181/x",
				"zk://127.0.0.1:2181/a//b",
				"zk://127.0.0.1:2181/a/../b",
				"zk://127.0.0.1:2181/x?unknown=1",
				"zk://127.0.0.1:2181/x?dial_timeout=0s",
			},
		})
	})
	t.Run("Curator", func(t *testing.T) { testCurator(t, zk) })
	t.Run("PausedHolderLosesSession", func(t *testing.T) {
		faulttest.PausedHolderLosesLease(t, zk.URL("/paused", ""), "paused", time.Second)
	})
}

func TestMain(m *testing.M) {
	faulttest.MaybeRunChild()
	os.Exit(m.Run())
}

// TestEnsembleLosesNode kills the leader of a 3-node ensemble while a
// lease is held and waiters wait: sessions move to the surviving nodes and
// no two holders are ever granted.
func TestEnsembleLosesNode(t *testing.T) {
	ens := testenv.StartZooKeeperEnsemble(t, 3)
	faulttest.NoTwoHolders(t, ens.URL("/ensemble", ""), "node-loss", 4, 10*time.Second, func(t *testing.T) {
		for _, n := range ens.Nodes {
			if mode, _ := n.Mode(); mode == "leader" {
				t.Logf("killing leader %d", n.ID)
				n.Kill()
				time.Sleep(3 * time.Second)
				return
			}
		}
		t.Fatal("no leader found")
	})
}
