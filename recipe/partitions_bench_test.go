package recipe_test

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenced-dev/fenced"
	_ "github.com/fenced-dev/fenced/fencedetcd"
	_ "github.com/fenced-dev/fenced/fencedpostgres"
	_ "github.com/fenced-dev/fenced/fencedredis"
	"github.com/fenced-dev/fenced/internal/core/rootaccess"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
	"github.com/fenced-dev/fenced/recipe"
)

// BenchmarkPartitionsRebalance measures, per backend and P, the time from
// a fourth member's join to a balanced group (every partition owned,
// counts within one), and from a graceful leave or a crash (its store
// connection closed under it, nothing released) of one of four to the
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
			for _, op := range []string{"join", "leave", "crash"} {
				b.Run(fmt.Sprintf("%s/P=%d/%s", st.name, p, op), func(b *testing.B) {
					url := st.url(b)
					ctx := context.Background()
					idle := func(ctx context.Context, p recipe.Partition) error { <-ctx.Done(); return nil }
					clients := map[*recipe.Partitions]*fenced.Client{}
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
						clients[m] = c
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
						case "crash":
							// The fourth member's store connection dies
							// as in a kill -9: nothing is released, its
							// grants stand until their TTL ends.
							ms = append(ms, join(fmt.Sprintf("d%d", i)))
							waitBalanced(b, ms, p)
							start := time.Now()
							rootaccess.Driver(clients[ms[3]]).Close()
							dead := ms[3]
							ms = ms[:3]
							waitBalanced(b, ms, p)
							total += time.Since(start)
							dead.Leave(ctx)
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

// waitBalanced waits until ms own every partition, each within the
// default RebalanceThreshold (10 %) of its share, plus one for the
// rounding: where the group comes to rest (within one at P = 64).
func waitBalanced(b *testing.B, ms []*recipe.Partitions, p int) {
	deadline := time.Now().Add(30 * time.Second)
	share := float64(p) / float64(len(ms))
	for {
		total, ok := 0, true
		for _, m := range ms {
			n := len(m.Owned())
			total += n
			if math.Abs(float64(n)-share) > 0.1*math.Ceil(share)+1 {
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

// BenchmarkPartitionsRequestsPerPeriod counts the requests a balanced,
// quiet group of three members sends its store per renewal period (TTL/3),
// per member, read from the server's own counters over ten periods:
// Redis's commands (INFO commandstats), PostgreSQL's committed and rolled-back
// transactions (pg_stat_database), etcd's handled unary gRPC calls
// (countedStores).
// Watches and subscriptions are streams, not requests.
//
//	go test -run '^$' -bench 'BenchmarkPartitionsRequestsPerPeriod' -benchtime 1x ./recipe/
func BenchmarkPartitionsRequestsPerPeriod(b *testing.B) {
	stores := countedStores()
	const ttl = 2 * time.Second
	const periods = 10
	for _, st := range stores {
		for _, p := range []int{64, 1024} {
			b.Run(fmt.Sprintf("%s/P=%d", st.name, p), func(b *testing.B) {
				url, count := st.start(b)
				total := func() float64 { return count(b).total }
				ctx := context.Background()
				idle := func(ctx context.Context, p recipe.Partition) error { <-ctx.Done(); return nil }
				var ms []*recipe.Partitions
				for _, id := range []string{"a", "b", "c"} {
					c, err := fenced.Open(ctx, url, nil)
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(func() { c.Close() })
					m, err := recipe.JoinPartitions(ctx, c, "bench", p, idle,
						&recipe.PartitionsOptions{MemberID: id, Lease: &fenced.LeaseOptions{TTL: ttl, MinFence: st.fence}})
					if err != nil {
						b.Fatal(err)
					}
					defer m.Leave(ctx)
					ms = append(ms, m)
				}
				waitBalanced(b, ms, p)
				time.Sleep(ttl) // tries and hand-offs of the join are over
				var perMember float64
				for range b.N {
					before := total()
					start := time.Now()
					time.Sleep(periods * ttl / 3)
					after := total()
					elapsed := time.Since(start)
					perMember += (after - before) / float64(len(ms)) / (float64(elapsed) / float64(ttl/3))
				}
				b.ReportMetric(perMember/float64(b.N), "requests/member/period")
			})
		}
	}
}

// countedStore is a backend whose server counts the requests it serves.
type countedStore struct {
	name string
	// start starts the server and returns its URL and a reading of its
	// request counters. A reading's own requests are not counted, or are
	// a constant few per reading.
	start func(b *testing.B) (url string, count func(b *testing.B) serverCounts)
	fence fenced.FenceStrength
}

// countedStores are the backends whose requests the benchmarks count:
// Redis's commands (INFO commandstats, its own INFO calls left out),
// PostgreSQL's committed and rolled-back transactions (pg_stat_database,
// two of them per reading; statements from pg_stat_statements), etcd's handled unary gRPC calls
// (grpc_server_handled_total, read over HTTP). Watches and subscriptions
// are streams, not requests.
func countedStores() []countedStore {
	return []countedStore{
		{"redis", func(b *testing.B) (string, func(*testing.B) serverCounts) {
			r := testenv.StartRedis(b, testenv.RedisConfig{})
			return r.URL(), func(b *testing.B) serverCounts {
				info, err := r.Do("INFO", "commandstats")
				if err != nil {
					b.Fatal(err)
				}
				out := map[string]float64{}
				for _, line := range strings.Split(info, "\n") {
					// cmdstat_get:calls=12,usec=...
					name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
					name, isCmd := strings.CutPrefix(name, "cmdstat_")
					if !ok || !isCmd || name == "info" {
						continue
					}
					calls, _, _ := strings.Cut(rest, ",")
					v, err := strconv.ParseFloat(calls, 64)
					if err != nil {
						b.Fatalf("redis commandstats %q: %v", line, err)
					}
					out[name] = v
				}
				return serverCounts{total: sumCounts(out), kinds: out}
			}
		}, fenced.FenceRepeatable}, // single-node Redis: its fence repeats only after a failover
		{"etcd", func(b *testing.B) (string, func(*testing.B) serverCounts) {
			e := testenv.StartEtcd(b)
			return e.URL(""), func(b *testing.B) serverCounts {
				resp, err := http.Get("http://" + e.Endpoints()[0] + "/metrics")
				if err != nil {
					b.Fatal(err)
				}
				defer resp.Body.Close()
				body, err := io.ReadAll(resp.Body)
				if err != nil {
					b.Fatal(err)
				}
				out := map[string]float64{}
				for _, line := range strings.Split(string(body), "\n") {
					if !strings.HasPrefix(line, "grpc_server_handled_total{") || !strings.Contains(line, `grpc_type="unary"`) {
						continue
					}
					v, err := strconv.ParseFloat(strings.TrimSpace(line[strings.LastIndexByte(line, '}')+1:]), 64)
					if err != nil {
						b.Fatalf("etcd metric %q: %v", line, err)
					}
					method := "unary"
					if _, m, ok := strings.Cut(line, `grpc_method="`); ok {
						method, _, _ = strings.Cut(m, `"`)
					}
					out[method] += v
				}
				return serverCounts{total: sumCounts(out), kinds: out}
			}
		}, fenced.FenceStrict},
		{"postgres", func(b *testing.B) (string, func(*testing.B) serverCounts) {
			pg := testenv.StartPostgres(b, "shared_preload_libraries=pg_stat_statements", "pg_stat_statements.track=all")
			conn, err := pgx.Connect(context.Background(), pg.URL())
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { conn.Close(context.Background()) })
			if _, err := conn.Exec(context.Background(), "CREATE EXTENSION pg_stat_statements"); err != nil {
				b.Fatal(err)
			}
			return pg.URL(), func(b *testing.B) serverCounts {
				var n float64
				// Statistics reach the view at most once a second.
				time.Sleep(1500 * time.Millisecond)
				if _, err := conn.Exec(context.Background(), "SELECT pg_stat_clear_snapshot()"); err != nil {
					b.Fatal(err)
				}
				if err := conn.QueryRow(context.Background(), "SELECT sum(xact_commit + xact_rollback)::float8 FROM pg_stat_database").Scan(&n); err != nil {
					b.Fatal(err)
				}
				rows, err := conn.Query(context.Background(),
					"SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 48), calls::float8 FROM pg_stat_statements")
				if err != nil {
					b.Fatal(err)
				}
				kinds := map[string]float64{}
				for rows.Next() {
					var q string
					var calls float64
					if err := rows.Scan(&q, &calls); err != nil {
						b.Fatal(err)
					}
					kinds["`"+q+"`"] += calls
				}
				if err := rows.Err(); err != nil {
					b.Fatal(err)
				}
				return serverCounts{total: n, kinds: kinds}
			}
		}, fenced.FenceStrict},
	}
}

// serverCounts is a reading of a server's request counters: the total,
// and a breakdown by kind (Redis: command; etcd: gRPC method; PostgreSQL:
// statement, from pg_stat_statements, nested ones included, while the
// total counts transactions).
type serverCounts struct {
	total float64
	kinds map[string]float64
}

// sumCounts is the total of a breakdown.
func sumCounts(m map[string]float64) float64 {
	var n float64
	for _, v := range m {
		n += v
	}
	return n
}
