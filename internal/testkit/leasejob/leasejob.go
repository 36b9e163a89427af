// Package leasejob is the scheduled-job scenario of the scheduler adapters'
// tests (fencedgocron, fencedcron): scheduler processes run a job that
// writes through a real fence.SQL guard on a SQLite or PostgreSQL
// resource, the test
// breaks or stops the lease of the run in progress, and Judge checks that
// the run's context ended, that its late writes were refused and that the
// resource never took an older fence after a newer one.
//
// A child's job calls Work with its run's context and lease. Work appends
// lines to the parent's output file (childproc.Output):
//
//	start PID FENCE UNIXNANO
//	write PID FENCE OUTCOME LIVE     (LIVE: 1 while the run's context is live)
//	ended PID FENCE UNIXNANO CAUSE   (CAUSE: broken, lost, expired or other)
package leasejob

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the resource's database/sql drivers
	_ "modernc.org/sqlite"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fence"
	"github.com/fenced-dev/fenced/internal/testkit/childproc"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// Environment variables that name the resource for children.
const (
	driverEnv = "LEASEJOB_DRIVER" // database/sql driver: "sqlite" or "pgx"
	dsnEnv    = "LEASEJOB_DSN"
)

// Row is the key of the guarded row every run writes.
const Row = "report"

// WriteEvery is the pause between a run's writes.
const WriteEvery = 50 * time.Millisecond

// LateFor bounds how long a run keeps writing after its context ended,
// waiting for the newer holder's write that makes the guard refuse it.
const LateFor = 20 * time.Second

var table = fence.Table{Name: "jobs", Key: "id"}

// Resource is the guarded database of one test: a table of one row, with
// the guard's columns. Each write appends its fence to the row's history
// column.
type Resource struct {
	driver, dsn string
}

// NewResource creates the resource in a SQLite file in a temporary
// directory. A process stopped in a write keeps SQLite's write lock: use
// NewPostgresResource for tests that stop processes.
func NewResource(t testing.TB) *Resource {
	t.Helper()
	path := filepath.Join(t.TempDir(), "resource.db")
	return newResource(t, "sqlite", "file:"+path+"?_pragma=busy_timeout(20000)&_pragma=journal_mode(WAL)&_txlock=immediate")
}

// NewPostgresResource creates the resource in the PostgreSQL database at
// url.
func NewPostgresResource(t testing.TB, url string) *Resource {
	t.Helper()
	return newResource(t, "pgx", url)
}

func newResource(t testing.TB, driver, dsn string) *Resource {
	r := &Resource{driver: driver, dsn: dsn}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `CREATE TABLE jobs (id TEXT PRIMARY KEY, history TEXT NOT NULL DEFAULT '')`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO jobs (id) VALUES ('`+Row+`')`); err != nil {
		t.Fatal(err)
	}
	g, err := fence.NewSQL(db, r.dialect(), table, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.EnsureColumns(ctx); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *Resource) dialect() fence.Dialect {
	if r.driver == "pgx" {
		return fence.Postgres
	}
	return fence.SQLite
}

// Env is the environment that names the resource for children.
func (r *Resource) Env() []string {
	return []string{driverEnv + "=" + r.driver, dsnEnv + "=" + r.dsn}
}

// History returns the fences of the writes the resource took, in the order
// it took them.
func (r *Resource) History(t testing.TB) []uint64 {
	t.Helper()
	db, err := sql.Open(r.driver, r.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var h string
	if err := db.QueryRowContext(context.Background(), `SELECT history FROM jobs WHERE id = '`+Row+`'`).Scan(&h); err != nil {
		t.Fatal(err)
	}
	var fences []uint64
	for _, f := range strings.Fields(h) {
		n, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			t.Fatalf("history %q: %v", h, err)
		}
		fences = append(fences, n)
	}
	return fences
}

// Writer is a child's guarded access to the parent's resource.
type Writer struct {
	g   *fence.SQL
	set string
}

// Guard opens, in a child, the guard over the parent's resource.
func Guard() (*Writer, error) {
	r := Resource{driver: os.Getenv(driverEnv), dsn: os.Getenv(dsnEnv)}
	db, err := sql.Open(r.driver, r.dsn)
	if err != nil {
		return nil, err
	}
	g, err := fence.NewSQL(db, r.dialect(), table, nil)
	if err != nil {
		return nil, err
	}
	set := "history = history || ?"
	if r.dialect() == fence.Postgres {
		set = "history = history || $1"
	}
	return &Writer{g: g, set: set}, nil
}

// Work is the job. It appends its fence to the row's history through g
// every WriteEvery until ctx ends. Then, as a job that ignores its context
// would, it goes on writing until the guard refuses a write (or LateFor has
// passed). It returns ctx's cause. Writes do not carry ctx: they test the
// fence, not the context.
func Work(ctx context.Context, l *fenced.Lease, w *Writer, out *os.File) error {
	pid := os.Getpid()
	fmt.Fprintf(out, "start %d %d %d\n", pid, l.Fence(), time.Now().UnixNano())
	tok := fence.From(l)
	var endedAt time.Time
	for {
		if endedAt.IsZero() && ctx.Err() != nil {
			endedAt = time.Now()
			fmt.Fprintf(out, "ended %d %d %d %s\n", pid, l.Fence(), endedAt.UnixNano(), causeName(context.Cause(ctx)))
		}
		live := 0
		if endedAt.IsZero() {
			live = 1
		}
		res, err := w.g.Update(context.Background(), nil, Row, tok, fence.Write{Set: w.set, SetArgs: []any{fmt.Sprintf("%d ", l.Fence())}})
		outcome := "error"
		if err == nil {
			outcome = strings.ReplaceAll(res.Outcome.String(), " ", "_")
		}
		fmt.Fprintf(out, "write %d %d %s %d\n", pid, l.Fence(), outcome, live)
		if !endedAt.IsZero() && (err == nil && !res.Applied() || time.Since(endedAt) > LateFor) {
			return context.Cause(ctx)
		}
		time.Sleep(WriteEvery)
	}
}

func causeName(err error) string {
	switch {
	case errors.Is(err, fenced.ErrBroken):
		return "broken"
	case errors.Is(err, fenced.ErrExpired):
		return "expired"
	case errors.Is(err, fenced.ErrLost):
		return "lost"
	default:
		return "other"
	}
}

// Start starts two children in mode "leasejob" (schedulers of the package
// under test). They run on a fresh SQLite store and resource, or on
// PostgreSQL for both when pg is set. A process stopped in a write keeps
// SQLite's write lock (fencedsqlite's availability caveat). That would stop
// the other scheduler too. out is the file the children append to.
func Start(t *testing.T, pg bool) (store string, res *Resource, procs []*testenv.Process, out string) {
	if pg {
		srv := testenv.StartPostgres(t)
		store, res = srv.URL(), NewPostgresResource(t, srv.URL())
	} else {
		store, res = "sqlite://"+filepath.Join(t.TempDir(), "leases.db"), NewResource(t)
	}
	out = filepath.Join(t.TempDir(), "runs")
	return store, res, childproc.Start(t, "leasejob", 2, store, out, res.Env()...), out
}

// Break returns a fault for Judge that breaks key on store as an admin
// would, and checks that the grant broken is the running job's.
func Break(t *testing.T, store, key string) Fault {
	admc, err := fenced.Open(context.Background(), store, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admc.Close() })
	return func(t testing.TB, _ *testenv.Process, f uint64) {
		info, err := admc.Break(context.Background(), key, "test", t.Name())
		if err != nil {
			t.Fatal(err)
		}
		if info.Fence != f {
			t.Fatalf("broke fence %d, want the running job's %d", info.Fence, f)
		}
	}
}
