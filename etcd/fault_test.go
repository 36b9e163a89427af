package etcd_test

import (
	"context"
	"os"
	"testing"
	"time"

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
