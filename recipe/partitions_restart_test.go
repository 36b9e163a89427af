package recipe_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	_ "github.com/fenced-dev/fenced/fenceddynamodb"
	_ "github.com/fenced-dev/fenced/fencedmysql"
	_ "github.com/fenced-dev/fenced/fencedzookeeper"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
	"github.com/fenced-dev/fenced/recipe"
)

// TestPartitionsRestartedMemberRejoins: a member cut off from the store as
// a kill -9 would leave it (its membership still stands, no longer
// renewed) and restarted at once with the same ID joins again, on the
// stores that keep a dead grant longest after its TTL: etcd (session
// rounded up to whole seconds plus one, expiries swept every 500 ms) and
// ZooKeeper at its default tickTime of 2 s (sessions of two ticks at
// least, expired on tick boundaries). Before, the join waited twice the
// TTL and gave up with ErrMemberLive (CI: TestPartitionsProofEtcd). It
// runs too on DynamoDB, whose observed expiry keeps a dead grant up to
// twice its TTL, and on MySQL, which ends it at its TTL.
func TestPartitionsRestartedMemberRejoins(t *testing.T) {
	if testing.Short() {
		t.Skip("long: members killed and restarted until they rejoin; run without -short")
	}
	e := testenv.StartEtcd(t)
	zk := testenv.StartZooKeeperWith(t, testenv.ZKConfig{TickTime: 2 * time.Second})
	dyn := testenv.StartDynalite(t, testenv.DynaliteConfig{})
	my := testenv.StartMySQL(t)
	myAddr := fmt.Sprintf("127.0.0.1:%d", my.Port)
	for _, tc := range []struct {
		name   string
		target string
		url    func(addr string) string
	}{
		{"etcd", e.Endpoints()[0], func(addr string) string { return "etcd://" + addr }},
		{"zookeeper", zk.Servers()[0], func(addr string) string { return "zk://" + addr + "/restart?tick_time=2s" }},
		{"dynamodb", fmt.Sprintf("127.0.0.1:%d", dyn.Port), func(addr string) string { return "dynamodb://" + addr + "/restart?create=1" }},
		{"mysql", myAddr, func(addr string) string { return strings.Replace(my.URL(), myAddr, addr, 1) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			idle := func(ctx context.Context, p recipe.Partition) error { <-ctx.Done(); return nil }
			for round := 0; round < 2; round++ {
				group := fmt.Sprintf("restart%d", round)
				o := &recipe.PartitionsOptions{MemberID: "m", Lease: &fenced.LeaseOptions{TTL: time.Second}}
				proxy := testenv.StartProxy(t, tc.target)
				first, err := fenced.Open(ctx, tc.url(proxy.Addr), nil)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := recipe.JoinPartitions(ctx, first, group, 8, idle, o); err != nil {
					t.Fatal(err)
				}
				// Let a renewal or keep-alive through just before the cut,
				// the worst moment for the restarted member.
				time.Sleep(time.Second + time.Duration(round)*300*time.Millisecond)
				proxy.BlackHole(true)
				cut := time.Now()
				second, err := fenced.Open(ctx, tc.url(tc.target), nil)
				if err != nil {
					t.Fatal(err)
				}
				m, err := recipe.JoinPartitions(ctx, second, group, 8, idle, o)
				if err != nil {
					t.Fatalf("round %d: the restarted member gave up %v after the cut: %v", round, time.Since(cut).Round(time.Millisecond), err)
				}
				t.Logf("round %d: joined again %v after the cut", round, time.Since(cut).Round(time.Millisecond))
				m.Leave(ctx)
				second.Close()
				go first.Close() // its store is out of reach: let it time out on its own
			}
		})
	}
}
