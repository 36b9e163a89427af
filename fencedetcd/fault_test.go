package fencedetcd_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedetcd"
	"github.com/fenced-dev/fenced/internal/core/rootaccess"
	"github.com/fenced-dev/fenced/internal/testkit/crashtest"
	"github.com/fenced-dev/fenced/internal/testkit/faulttest"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

func TestMain(m *testing.M) {
	crashtest.MaybeRunHolder()
	os.Exit(m.Run())
}

// TestLeaderLoss kills the leader of a 3-member cluster while a lease is
// held and waiters wait; then pauses a holder past its session.
func TestFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("long: SIGSTOP and restarts of etcd past TTLs; run without -short")
	}
	cluster := testenv.StartEtcdCluster(t, 3)
	url := cluster.URL("")
	t.Run("LeaderLossWhileHeldAndWaiting", func(t *testing.T) {
		faulttest.NoTwoHolders(t, url, "leader-loss", 4, 10*time.Second, func(t *testing.T) {
			cli := newClient(t, cluster)
			for _, m := range cluster.Members {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				st, err := cli.Status(ctx, m.Endpoint)
				cancel()
				if err == nil && st.Leader == st.Header.MemberId {
					t.Logf("killing leader %s", m.Name)
					m.Kill()
					time.Sleep(3 * time.Second) // election and client failover
					return
				}
			}
			t.Fatal("no leader found")
		})
	})
	t.Run("PausedHolderLosesSession", func(t *testing.T) {
		faulttest.PausedHolderLosesLease(t, testenv.StartEtcd(t).URL(""), "paused", 3*time.Second)
	})
}

// TestLossWatchSurvivesRestart checks that the driver's loss watches, which
// share one Watch stream, are set up again when the stream breaks, even
// when the history they start from was compacted meanwhile: a lease held
// across a compaction and a restart of the (single) etcd member, then
// broken by an admin, ends with ErrLost long before its local validity
// would end it (it is not renewed, so nothing else would notice).
func TestLossWatchSurvivesRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("long: compacts and restarts etcd; run without -short")
	}
	cluster, c := openByURL(t)
	ctx := context.Background()
	l, err := c.Acquire(ctx, "restart", &fenced.LeaseOptions{TTL: 30 * time.Second, ManualRenew: true})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // the loss watch starts
	// Compact the history past the lease's key: the watch set up again on
	// the new stream asks for revisions that are gone, the server cancels
	// it, and the driver reads the key instead and watches it from there.
	cli := newClient(t, cluster)
	var put *clientv3.PutResponse
	for range 2 { // compaction keeps the revision it is made at
		if put, err = cli.Put(ctx, "unrelated", "write"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cli.Compact(ctx, put.Header.Revision); err != nil {
		t.Fatal(err)
	}
	m := cluster.Members[0]
	m.Kill()
	m.Start()
	m.WaitReady()
	time.Sleep(2 * time.Second) // the stream is opened again
	if l.Err() != nil {
		t.Fatalf("lease ended across the restart: %v", l.Err())
	}
	operator, err := fenced.Open(ctx, cluster.URL(""), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer operator.Close()
	if _, err := operator.Break(ctx, "restart", "test", "TestLossWatchSurvivesRestart"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Context().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the broken lease was not ended within 10s of the break after a restart")
	}
	if err := l.Err(); !errors.Is(err, fenced.ErrLost) {
		t.Fatalf("lease ended with %v, want ErrLost", err)
	}
}

// TestReconnectSoonAfterRestart: a client opened by URL whose etcd was
// down for 12 s works again soon after etcd is back, not when gRPC's
// exponential reconnect backoff (up to 2 minutes by default) next tries:
// a waiter queued behind a key freed meanwhile would wait that long.
func TestReconnectSoonAfterRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("long: restarts etcd; run without -short")
	}
	cluster, c := openByURL(t)
	ctx := context.Background()
	d := rootaccess.Driver(c).(*fencedetcd.Driver)
	if _, err := d.Client().Get(ctx, "probe"); err != nil {
		t.Fatal(err)
	}
	m := cluster.Members[0]
	m.Kill()
	time.Sleep(12 * time.Second) // reconnect attempts back off meanwhile
	m.Start()
	m.WaitReady()
	back := time.Now()
	for {
		rctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		_, err := d.Client().Get(rctx, "probe")
		cancel()
		if err == nil {
			break
		}
		if time.Since(back) > 30*time.Second {
			t.Fatalf("no answer 30s after etcd came back: %v", err)
		}
	}
	lag := time.Since(back)
	t.Logf("first answer %v after etcd accepted connections again", lag.Round(time.Millisecond))
	if lag > 2500*time.Millisecond {
		t.Fatalf("first answer %v after etcd was back, want within the reconnect backoff's 1 s cap (plus a connect)", lag)
	}
}

// openByURL starts a one-member etcd and opens a Client on it by URL (so
// with the client fenced builds: keepalive, reconnect backoff), closed
// when the test ends.
func openByURL(t *testing.T) (*testenv.EtcdCluster, *fenced.Client) {
	t.Helper()
	cluster := testenv.StartEtcd(t)
	c, err := fenced.Open(context.Background(), cluster.URL(""), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return cluster, c
}
