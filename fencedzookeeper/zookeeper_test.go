package fencedzookeeper_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/fencedzookeeper/internal/zk"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/drivertest"
	"github.com/fenced-dev/fenced/fencedzookeeper"
	"github.com/fenced-dev/fenced/internal/core/rootaccess"
	"github.com/fenced-dev/fenced/internal/testkit/crashtest"
	"github.com/fenced-dev/fenced/internal/testkit/faulttest"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
	"github.com/fenced-dev/fenced/recipe/recipetest"
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
	return rootaccess.Driver(c)
}

// TestZooKeeper runs everything that needs a standalone server under one
// server, since a JVM takes seconds to start.
func TestZooKeeper(t *testing.T) {
	ens := testenv.StartZooKeeper(t)
	probe, err := fenced.Open(context.Background(), ens.URL("/probe", ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	shortTTL := drivertest.MeasuredTTL(t, 500*time.Millisecond, probe)
	probe.Close()
	t.Run("Conformance", func(t *testing.T) {
		h := drivertest.Harness{
			Open: func(t *testing.T) driver.Driver {
				return openDriver(t, ens.URL("/conformance", ""))
			},
			ShortTTL: shortTTL,
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
				"zk://127.0.0.1:2181/x?tick_time=-1s",
				"zk://127.0.0.1:2181/x?tick_time=2",
				"zk://127.0.0.1:2181/x?dial_timeout=1s;tick_time=2s",
				"zk://127.0.0.1:2181/x?dial_timeout=1s&dial_timeout=2s",
			},
		}
		drivertest.RunConformanceTests(t, h)
		recipetest.RunConformanceTests(t, h)
	})
	t.Run("ConformanceWithOptions", func(t *testing.T) {
		if testing.Short() {
			t.Skip("long: the suite again, opened by Options instead of a URL; run without -short")
		}
		h := drivertest.Harness{
			Open: func(t *testing.T) driver.Driver {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				d, err := fencedzookeeper.New(ctx, &fencedzookeeper.Options{Servers: ens.Servers(), Root: "/conformance-new", TickTime: ens.TickTime})
				if err != nil {
					t.Fatal(err)
				}
				return d
			},
			ShortTTL: shortTTL,
		}
		drivertest.RunConformanceTests(t, h)
		recipetest.RunConformanceTests(t, h)
	})
	t.Run("Curator", func(t *testing.T) { testCurator(t, ens) })
	t.Run("ForeignNodes", func(t *testing.T) { testForeignNodes(t, ens) })
	t.Run("HandoverRequests", func(t *testing.T) { testHandoverRequests(t, ens) })
	t.Run("ConnectionLossOnCreate", func(t *testing.T) { testConnectionLossOnCreate(t, ens) })
	t.Run("ConnectionLossOnCreateAndLookup", func(t *testing.T) { testConnectionLossOnCreateAndLookup(t, ens) })
	t.Run("CreateAbandoned", func(t *testing.T) { testCreateAbandoned(t, ens) })
	t.Run("LossWatchAcrossRestart", func(t *testing.T) {
		if testing.Short() {
			t.Skip("long: restarts ZooKeeper; run without -short")
		}
		testLossWatchAcrossRestart(t, ens)
	})
	t.Run("PausedHolderLosesSession", func(t *testing.T) {
		if testing.Short() {
			t.Skip("long: SIGSTOP of a holder past its session; run without -short")
		}
		faulttest.PausedHolderLosesLease(t, ens.URL("/paused", ""), "paused", 2*time.Second)
	})
}

func TestMain(m *testing.M) {
	crashtest.MaybeRunHolder()
	os.Exit(m.Run())
}

// TestEnsemble runs the tests that need a 3-node ensemble under one
// ensemble, since three JVMs take a while to start. Its tick is 200ms: the
// leader pings followers every 100ms.
func TestEnsemble(t *testing.T) {
	if testing.Short() {
		t.Skip("long: a 3-node ensemble, sessions past validity and a killed leader; run without -short")
	}
	ens := testenv.StartZooKeeperWith(t, testenv.ZKConfig{Nodes: 3, TickTime: 200 * time.Millisecond})
	t.Run("SessionOutlivesValidity", func(t *testing.T) { testSessionOutlivesValidity(t, ens) })
	t.Run("WaiterSessionOutlivesValidity", func(t *testing.T) { testWaiterSessionOutlivesValidity(t, ens) })
	t.Run("LosesNode", func(t *testing.T) { testEnsembleLosesNode(t, ens) })
}

// testEnsembleLosesNode kills the leader of a 3-node ensemble while a
// lease is held and waiters wait: sessions move to the surviving nodes and
// no two holders are ever granted.
func testEnsembleLosesNode(t *testing.T, ens *testenv.ZKEnsemble) {
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

// TestUnreachable checks that opening an ensemble nobody listens on fails
// with a clear error matching ErrUnavailable.
func TestUnreachable(t *testing.T) {
	url := fmt.Sprintf("zk://127.0.0.1:%d/x?dial_timeout=500ms", testenv.FreePort(t))
	_, err := fenced.Open(context.Background(), url, nil)
	if !errors.Is(err, fenced.ErrUnavailable) || !strings.Contains(err.Error(), "cannot reach ZooKeeper") {
		t.Fatalf("Open(%s) = %v, want ErrUnavailable saying it cannot reach ZooKeeper", url, err)
	}
}

// testForeignNodes checks that a lock path holding a node that is not a
// lock node gives a clear error and leaves nothing of ours behind.
func testForeignNodes(t *testing.T, ens *testenv.ZKEnsemble) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, _, err := zk.Connect(ens.Servers(), 10*time.Second, zk.WithLogInfo(false))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, p := range []string{"/foreign", "/foreign/k", "/foreign/k/not-a-lock-node"} {
		if _, err := conn.Create(p, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			t.Fatal(err)
		}
	}
	c, err := fenced.Open(ctx, ens.URL("/foreign", ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, wait := range []time.Duration{0, time.Second} {
		_, err := c.Acquire(ctx, "k", &fenced.LeaseOptions{MaxWait: wait})
		if err == nil || !strings.Contains(err.Error(), `foreign node "not-a-lock-node"`) || !strings.Contains(err.Error(), "/foreign/k") {
			t.Fatalf("Acquire (MaxWait %v) on a lock path with a foreign node: %v, want an error naming the node and path", wait, err)
		}
	}
	if _, err := c.Inspect(ctx, "k"); err == nil || !strings.Contains(err.Error(), "foreign node") {
		t.Fatalf("Inspect: %v, want the foreign-node error", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		kids, _, err := conn.Children("/foreign/k")
		if err != nil {
			t.Fatal(err)
		}
		if len(kids) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("our lock nodes were left behind: %v", kids)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
