package fence_test

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fenced-dev/fenced/fence"
	"github.com/fenced-dev/fenced/fence/etcdfence"
	"github.com/fenced-dev/fenced/fence/redisfence"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// measure runs op b.N times and reports p50 and p99 latency.
func measure(b *testing.B, op func(i int) error) {
	b.Helper()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if err := op(i); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

// benchSQL compares a guarded update with the same update unguarded (one
// statement each, autocommit).
func benchSQL(b *testing.B, e sqlEnv) {
	ctx := context.Background()
	name := fmt.Sprintf("bench_jobs_%d", time.Now().UnixNano()%1e6)
	if _, err := e.db.Exec(fmt.Sprintf(`CREATE TABLE %s (job_id VARCHAR(64) PRIMARY KEY, status VARCHAR(16) NOT NULL, sends INTEGER NOT NULL DEFAULT 0, note VARCHAR(64))`, name)); err != nil {
		b.Fatal(err)
	}
	e.db.Exec(fmt.Sprintf(`INSERT INTO %s (job_id, status) VALUES ('j', 'PENDING')`, name))
	g, err := fence.NewSQL(e.db, e.d, fence.Table{Name: name, Key: "job_id"}, nil)
	if err != nil {
		b.Fatal(err)
	}
	if err := g.EnsureColumns(ctx); err != nil {
		b.Fatal(err)
	}
	tk := tok(7, "owner-bench")
	b.Run("Plain", func(b *testing.B) {
		q := fmt.Sprintf("UPDATE %s SET note = %s WHERE job_id = %s", name, e.ph(1), e.ph(2))
		measure(b, func(i int) error {
			_, err := e.db.ExecContext(ctx, q, "n", "j")
			return err
		})
	})
	b.Run("Guarded", func(b *testing.B) {
		measure(b, func(i int) error {
			r, err := e.note(ctx, g, nil, "j", tk, "n")
			if err == nil && !r.Applied() {
				err = r.Err()
			}
			return err
		})
	})
	b.Run("GuardedStale", func(b *testing.B) {
		old := tok(3, "owner-old")
		measure(b, func(i int) error {
			r, err := e.note(ctx, g, nil, "j", old, "n")
			if err == nil && r.Outcome != fence.Stale {
				err = fmt.Errorf("want stale, got %v", r.Outcome)
			}
			return err
		})
	})
}

func BenchmarkSQLGuardSQLite(b *testing.B) {
	benchSQL(b, sqlEnv{db: openSQLite(b), d: fence.SQLite})
}

func BenchmarkSQLGuardPostgres(b *testing.B) {
	pg := testenv.StartPostgres(b)
	db, err := openBenchDB("pgx", pg.URL())
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	benchSQL(b, sqlEnv{db: db, d: fence.Postgres})
}

func BenchmarkRedisGuard(b *testing.B) {
	ctx := context.Background()
	srv := testenv.StartRedis(b, testenv.RedisConfig{NoPersistence: true})
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer c.Close()
	g, _ := redisfence.New(c, &redisfence.Options{})
	tk := tok(7, "owner-bench")
	b.Run("PlainHSET", func(b *testing.B) {
		measure(b, func(int) error { return c.HSet(ctx, "plain", "note", "n").Err() })
	})
	b.Run("Guarded", func(b *testing.B) {
		measure(b, func(int) error {
			_, err := g.Write(ctx, "guarded", tk, redisfence.Write{Set: []string{"note", "n"}})
			return err
		})
	})
}

func BenchmarkEtcdGuard(b *testing.B) {
	ctx := context.Background()
	cluster := testenv.StartEtcd(b)
	c, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints(), DialTimeout: 10 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	g, _ := etcdfence.New(c, nil)
	tk := tok(7, "owner-bench")
	b.Run("PlainPut", func(b *testing.B) {
		measure(b, func(int) error { _, err := c.Put(ctx, "plain/note", "n"); return err })
	})
	b.Run("Guarded", func(b *testing.B) {
		measure(b, func(int) error {
			_, err := g.Write(ctx, "guarded", tk, etcdfence.Write{Then: []clientv3.Op{clientv3.OpPut("guarded/note", "n")}})
			return err
		})
	})
}

func openBenchDB(driverName, dsn string) (*sql.DB, error) {
	db, err := sql.Open(driverName, dsn)
	if err != nil {
		return nil, err
	}
	return db, db.Ping()
}
