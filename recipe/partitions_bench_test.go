package recipe_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	_ "github.com/fenced-dev/fenced/fencedetcd"
	_ "github.com/fenced-dev/fenced/fencedpostgres"
	_ "github.com/fenced-dev/fenced/fencedredis"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
	"github.com/fenced-dev/fenced/recipe"
)

// BenchmarkPartitionsRebalance measures, per backend and P, the time from
// a fourth member's join to a balanced group (every partition owned,
// counts within one), and from a graceful leave of one of four to the
// three owning everything. It reports rebalance-ms per operation; the
// group's TTL is 2s (poll TTL/3), so a backend without notification
// shows its poll here.
//
//	go test -run '^$' -bench 'BenchmarkPartitionsRebalance/sqlite' -benchtime 5x ./recipe/
func BenchmarkPartitionsRebalance(b *testing.B) {
	stores := []struct {
		name  string
		url   func(b *testing.B) string
		fence fenced.FenceStrength
	}{
		{"sqlite", func(b *testing.B) string { return "sqlite://" + filepath.Join(b.TempDir(), "leases.db") }, fenced.FenceStrict},
		{"postgres", func(b *testing.B) string { return testenv.StartPostgres(b).URL() }, fenced.FenceStrict},
		// Single-node Redis: its fence repeats only after a failover.
		{"redis", func(b *testing.B) string { return testenv.StartRedis(b, testenv.RedisConfig{}).URL() }, fenced.FenceRepeatable},
		{"etcd", func(b *testing.B) string { return testenv.StartEtcd(b).URL("") }, fenced.FenceStrict},
	}
	for _, st := range stores {
		for _, p := range []int{64, 1024} {
			for _, op := range []string{"join", "leave"} {
				b.Run(fmt.Sprintf("%s/P=%d/%s", st.name, p, op), func(b *testing.B) {
					url := st.url(b)
					ctx := context.Background()
					idle := func(ctx context.Context, p recipe.Partition) error { <-ctx.Done(); return nil }
					join := func(id string) *recipe.Partitions {
						c, err := fenced.Open(ctx, url, nil)
						if err != nil {
							b.Fatal(err)
						}
						b.Cleanup(func() { c.Close() })
						m, err := recipe.JoinPartitions(ctx, c, "bench", p, idle,
							&recipe.PartitionsOptions{MemberID: id, Lease: &fenced.LeaseOptions{TTL: 2 * time.Second, MinFence: st.fence}})
						if err != nil {
							b.Fatal(err)
						}
						return m
					}
					ms := []*recipe.Partitions{join("a"), join("b"), join("c")}
					defer func() {
						for _, m := range ms {
							m.Leave(ctx)
						}
					}()
					waitBalanced(b, ms, p)
					var total time.Duration
					b.ResetTimer()
					for i := range b.N {
						switch op {
						case "join":
							start := time.Now()
							ms = append(ms, join(fmt.Sprintf("d%d", i)))
							waitBalanced(b, ms, p)
							total += time.Since(start)
							ms[3].Leave(ctx)
							ms = ms[:3]
						case "leave":
							ms = append(ms, join(fmt.Sprintf("d%d", i)))
							waitBalanced(b, ms, p)
							start := time.Now()
							ms[3].Leave(ctx)
							ms = ms[:3]
							waitBalanced(b, ms, p)
							total += time.Since(start)
						}
						b.StopTimer()
						waitBalanced(b, ms, p)
						b.StartTimer()
					}
					b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "rebalance-ms/op")
				})
			}
		}
	}
}

// waitBalanced waits until ms own every partition, counts within one.
func waitBalanced(b *testing.B, ms []*recipe.Partitions, p int) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		total, ok := 0, true
		for _, m := range ms {
			n := len(m.Owned())
			total += n
			if n != p/len(ms) && n != (p+len(ms)-1)/len(ms) {
				ok = false
			}
		}
		if ok && total == p {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("not balanced after 30s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
