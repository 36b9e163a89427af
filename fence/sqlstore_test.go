package fence_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/fence"
	"github.com/fenced-dev/fenced/internal/testkit/opentest"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

var storeTableSeq atomic.Int64

func storeTable() string { return fmt.Sprintf("http_fences_%d", storeTableSeq.Add(1)) }

func openStore(t *testing.T, db *sql.DB, d fence.Dialect, table string) *fence.SQLStore {
	t.Helper()
	s, err := fence.OpenSQLStore(context.Background(), db, d, &fence.SQLStoreOptions{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// openSQLiteDeferred opens a SQLite file the way most users do: a busy
// timeout, but the default (deferred) BEGIN.
func openSQLiteDeferred(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(20000)&_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func TestSQLStoreSQLite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fences.db")
	db := openSQLiteDeferred(t, path)
	runStoreTests(t, func(t *testing.T) storeUnderTest { return sqlStore{openStore(t, db, fence.SQLite, storeTable())} })
	t.Run("Durable", func(t *testing.T) {
		testSQLStoreDurable(t, fence.SQLite, func() *sql.DB { return openSQLiteDeferred(t, path) })
	})
	t.Run("Shape", func(t *testing.T) {
		ctx := context.Background()
		for name, ddl := range map[string]string{
			"text fence":   `CREATE TABLE %s (lease_key TEXT PRIMARY KEY, fence TEXT NOT NULL, owner TEXT NOT NULL)`,
			"no key":       `CREATE TABLE %s (lease_key TEXT NOT NULL, fence INTEGER NOT NULL, owner TEXT NOT NULL)`,
			"wide key":     `CREATE TABLE %s (lease_key TEXT, fence INTEGER NOT NULL, owner TEXT NOT NULL, PRIMARY KEY (lease_key, owner))`,
			"owner absent": `CREATE TABLE %s (lease_key TEXT PRIMARY KEY, fence INTEGER NOT NULL)`,
		} {
			table := storeTable()
			if _, err := db.Exec(fmt.Sprintf(ddl, table)); err != nil {
				t.Fatal(err)
			}
			if _, err := fence.OpenSQLStore(ctx, db, fence.SQLite, &fence.SQLStoreOptions{Table: table}); !errors.Is(err, fence.ErrSchema) {
				t.Errorf("%s: %v, want ErrSchema", name, err)
			}
		}
		if _, err := fence.OpenSQLStore(ctx, db, fence.SQLite, &fence.SQLStoreOptions{Table: "x; DROP TABLE y"}); !errors.Is(err, fence.ErrSchema) {
			t.Errorf("bad table name: %v", err)
		}
		if _, err := fence.OpenSQLStore(ctx, db, fence.MySQL, nil); err == nil || !strings.Contains(err.Error(), "not supported") {
			t.Errorf("MySQL: %v", err)
		}
		if _, err := fence.OpenSQLStore(ctx, nil, fence.SQLite, nil); err == nil {
			t.Error("nil db accepted")
		}
		s := openStore(t, db, fence.SQLite, "")
		if r, done, err := s.Admit(ctx, fence.Token{Key: "k", Fence: 1, Owner: "o"}); err != nil || !r.Applied() {
			t.Fatalf("default table: %+v %v", r, err)
		} else {
			done()
		}
	})
}

func TestSQLStorePostgres(t *testing.T) {
	t.Parallel()
	pg := testenv.StartPostgres(t)
	db := opentest.DB(t, "pgx", pg.URL())
	runStoreTests(t, func(t *testing.T) storeUnderTest { return sqlStore{openStore(t, db, fence.Postgres, storeTable())} })
	t.Run("Durable", func(t *testing.T) {
		testSQLStoreDurable(t, fence.Postgres, func() *sql.DB { return opentest.DB(t, "pgx", pg.URL()) })
	})
	t.Run("AcrossProcesses", func(t *testing.T) {
		// Two pools stand for two processes serving the same resource.
		table := storeTable()
		s1 := openStore(t, db, fence.Postgres, table)
		s2 := openStore(t, opentest.DB(t, "pgx", pg.URL()), fence.Postgres, table)
		testStoreAcrossProcesses(t, s1, s2)
	})
	t.Run("NewerWhileWaiting", func(t *testing.T) {
		// C, a second request of holder A (fence 5), waits in process 2
		// while A's first request runs in process 1; B (fence 6) is
		// admitted in process 3 meanwhile. When the key comes free, C must
		// not run: a newer holder exists.
		ctx := context.Background()
		table := storeTable()
		s1 := openStore(t, db, fence.Postgres, table)
		s2 := openStore(t, opentest.DB(t, "pgx", pg.URL()), fence.Postgres, table)
		s3 := openStore(t, opentest.DB(t, "pgx", pg.URL()), fence.Postgres, table)
		a := fence.Token{Key: "job:n", Fence: 5, Owner: "a"}
		r, doneA, err := s1.Admit(ctx, a)
		if err != nil || !r.Applied() {
			t.Fatal(r, err)
		}
		results := make(chan fence.Result, 2)
		admit := func(s *fence.SQLStore, tk fence.Token) {
			hctx, cancel := context.WithTimeout(ctx, hangLimit)
			defer cancel()
			r, done, err := s.Admit(hctx, tk)
			if err != nil {
				t.Error(err)
			}
			if done != nil {
				done()
			}
			results <- r
		}
		// waiting polls until n requests wait for an advisory lock (and,
		// for B, until its fence is the row's): fixed sleeps were too
		// short on a loaded machine, where B had not arrived when A ended.
		waiting := func(n int, fence uint64) {
			t.Helper()
			for deadline := time.Now().Add(hangLimit); ; time.Sleep(10 * time.Millisecond) {
				var w int
				if err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`).Scan(&w); err != nil {
					t.Fatal(err)
				}
				f, _, err := s1.Current(ctx, "job:n")
				if err != nil {
					t.Fatal(err)
				}
				if w >= n && f == fence {
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d requests wait for the key's lock and its fence is %d after %v; want %d waiting at fence %d", w, f, hangLimit, n, fence)
				}
			}
		}
		go admit(s2, a)
		waiting(1, 5) // C reaches the lock first
		go admit(s3, fence.Token{Key: "job:n", Fence: 6, Owner: "b"})
		waiting(2, 6)
		doneA()
		var applied, stale int
		for range 2 {
			switch r := <-results; {
			case r.Applied():
				applied++
			case r.Outcome == fence.Stale && r.Current == 6:
				stale++
			default:
				t.Errorf("result %+v", r)
			}
		}
		if applied != 1 || stale != 1 {
			t.Fatalf("%d applied, %d stale; want B applied and C refused", applied, stale)
		}
	})
	t.Run("OnePoolConnection", func(t *testing.T) {
		// Admission never needs two connections at once, so a pool of one
		// serves requests one after another instead of deadlocking.
		one := opentest.DB(t, "pgx", pg.URL())
		one.SetMaxOpenConns(1)
		s := openStore(t, one, fence.Postgres, storeTable())
		ctx, cancel := context.WithTimeout(context.Background(), hangLimit)
		defer cancel()
		r, done, err := s.Admit(ctx, fence.Token{Key: "job:1", Fence: 1, Owner: "o"})
		if err != nil || !r.Applied() {
			t.Fatal(r, err)
		}
		next := make(chan error, 1)
		go func() {
			_, done2, err := s.Admit(ctx, fence.Token{Key: "job:2", Fence: 1, Owner: "o"})
			if done2 != nil {
				done2()
			}
			next <- err
		}()
		done()
		if err := <-next; err != nil {
			t.Fatalf("second key on a pool of one: %v", err)
		}
	})
	t.Run("Shape", func(t *testing.T) {
		ctx := context.Background()
		for name, ddl := range map[string]string{
			"int fence":    `CREATE TABLE %s (lease_key TEXT PRIMARY KEY, fence INTEGER NOT NULL, owner TEXT NOT NULL)`,
			"no key":       `CREATE TABLE %s (lease_key TEXT NOT NULL, fence BIGINT NOT NULL, owner TEXT NOT NULL)`,
			"wide key":     `CREATE TABLE %s (lease_key TEXT, fence BIGINT NOT NULL, owner TEXT NOT NULL, PRIMARY KEY (lease_key, owner))`,
			"owner absent": `CREATE TABLE %s (lease_key TEXT PRIMARY KEY, fence BIGINT NOT NULL)`,
		} {
			table := storeTable()
			if _, err := db.Exec(fmt.Sprintf(ddl, table)); err != nil {
				t.Fatal(err)
			}
			if _, err := fence.OpenSQLStore(ctx, db, fence.Postgres, &fence.SQLStoreOptions{Table: table}); !errors.Is(err, fence.ErrSchema) {
				t.Errorf("%s: %v, want ErrSchema", name, err)
			}
		}
		if _, err := db.Exec(`CREATE SCHEMA billing`); err != nil {
			t.Fatal(err)
		}
		s := openStore(t, db, fence.Postgres, "billing.fences")
		if r, done, err := s.Admit(ctx, fence.Token{Key: "k", Fence: 1, Owner: "o"}); err != nil || !r.Applied() {
			t.Fatalf("schema-qualified table: %+v %v", r, err)
		} else {
			done()
		}
		openStore(t, db, fence.Postgres, "billing.fences") // an existing table of the right shape
	})
}

// testSQLStoreDurable: fences survive the resource's restart (a new pool
// and a new store on the same table), which MemoryStore cannot offer.
func testSQLStoreDurable(t *testing.T, d fence.Dialect, reopen func() *sql.DB) {
	ctx := context.Background()
	table := storeTable()
	s := openStore(t, reopen(), d, table)
	r, done, err := s.Admit(ctx, fence.Token{Key: "job:d", Fence: 7, Owner: "a"})
	if err != nil || !r.Applied() {
		t.Fatal(r, err)
	}
	done()
	restarted := openStore(t, reopen(), d, table)
	if r, _, err := restarted.Admit(ctx, fence.Token{Key: "job:d", Fence: 6, Owner: "b"}); err != nil || r.Outcome != fence.Stale || r.Current != 7 {
		t.Fatalf("stale token after a restart: %+v %v", r, err)
	}
}

// testStoreAcrossProcesses: while one process's handler holds a key, the
// other process's admission of a newer token for it waits, so the older
// write never lands after the newer one.
func testStoreAcrossProcesses(t *testing.T, s1, s2 fence.Store) {
	ctx := context.Background()
	r, done1, err := s1.Admit(ctx, fence.Token{Key: "job:x", Fence: 5, Owner: "a"})
	if err != nil || !r.Applied() {
		t.Fatal(r, err)
	}
	admitted := make(chan fence.Result, 1)
	go func() {
		hctx, cancel := context.WithTimeout(ctx, hangLimit)
		defer cancel()
		r, done2, err := s2.Admit(hctx, fence.Token{Key: "job:x", Fence: 6, Owner: "b"})
		if err != nil {
			t.Error(err)
		}
		if done2 != nil {
			done2()
		}
		admitted <- r
	}()
	select {
	case r := <-admitted:
		t.Fatalf("the other process admitted %+v while the first still held the key", r)
	case <-time.After(300 * time.Millisecond):
	}
	// Another key is not held up.
	hctx, cancel := context.WithTimeout(ctx, hangLimit)
	defer cancel()
	if r, done, err := s2.Admit(hctx, fence.Token{Key: "job:y", Fence: 1, Owner: "c"}); err != nil || !r.Applied() {
		t.Fatalf("another key: %+v %v", r, err)
	} else {
		done()
	}
	done1()
	if r := <-admitted; !r.Applied() {
		t.Fatalf("the other process after the first finished: %+v", r)
	}
}
