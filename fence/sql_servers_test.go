package fence_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/fenced-dev/fenced/fence"
	"github.com/fenced-dev/fenced/internal/testkit/opentest"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

func TestSQLGuardPostgres(t *testing.T) {
	t.Parallel()
	pg := testenv.StartPostgres(t)
	runSQLGuardTests(t, sqlEnv{db: opentest.DB(t, "pgx", pg.URL()), d: fence.Postgres})
}

// TestSQLGuardMySQL runs on MariaDB with the driver's default settings:
// affected rows count changed rows, not matched ones, which the guard
// accounts for.
func TestSQLGuardMySQL(t *testing.T) {
	t.Parallel()
	my := testenv.StartMySQL(t)
	runSQLGuardTests(t, sqlEnv{db: opentest.DB(t, "mysql", my.DSN()), d: fence.MySQL})
}

// TestSQLGuardMySQLCollation (issue 16, item 4): with the server's default
// latin1_swedish_ci, a case-insensitive owner column took owner "worker-a"
// for "Worker-A", so an equal fence from another owner was applied. The
// shape check refuses such identity columns, EnsureColumns converts them,
// and the guard's comparisons stay byte-exact even if a column is changed
// back behind its back.
func TestSQLGuardMySQLCollation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	my := testenv.StartMySQL(t)
	db := opentest.DB(t, "mysql", my.DSN())
	exec := func(q string) {
		t.Helper()
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec(`CREATE TABLE jobs (job_id VARCHAR(64) PRIMARY KEY, note VARCHAR(64),
  fence BIGINT NOT NULL DEFAULT 0, fence_owner VARCHAR(64) NOT NULL DEFAULT '', fence_key VARCHAR(256) NOT NULL DEFAULT '')
  CHARACTER SET latin1 COLLATE latin1_swedish_ci`)
	exec(`INSERT INTO jobs (job_id, note) VALUES ('inv_72', 'orig')`)
	g, err := fence.NewSQL(db, fence.MySQL, fence.Table{Name: "jobs", Key: "job_id"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = g.Check(ctx)
	if !errors.Is(err, fence.ErrSchema) || !strings.Contains(err.Error(), "column fence_owner uses collation latin1_swedish_ci") || !strings.Contains(err.Error(), "column fence_key uses collation latin1_swedish_ci") {
		t.Fatalf("Check with case-insensitive identity columns: %v", err)
	}
	upper := fence.Token{Key: "invoice:inv_72", Fence: 5, Owner: "Worker-A"}
	lower := fence.Token{Key: "invoice:inv_72", Fence: 5, Owner: "worker-a"}
	note := func(tk fence.Token, text string) (fence.Result, error) {
		return g.Update(ctx, nil, "inv_72", tk, fence.Write{Set: "note = ?", SetArgs: []any{text}})
	}
	if _, err := note(upper, "upper"); !errors.Is(err, fence.ErrSchema) {
		t.Fatalf("write before the columns are fixed: %v, want ErrSchema", err)
	}
	if err := g.EnsureColumns(ctx); err != nil {
		t.Fatalf("EnsureColumns: %v", err)
	}
	var ownerColl, keyColl string
	if err := db.QueryRow(`SELECT
  MAX(CASE WHEN column_name = 'fence_owner' THEN collation_name END), MAX(CASE WHEN column_name = 'fence_key' THEN collation_name END)
  FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = 'jobs'`).Scan(&ownerColl, &keyColl); err != nil {
		t.Fatal(err)
	}
	if ownerColl != "ascii_bin" || keyColl != "utf8mb4_bin" {
		t.Fatalf("after EnsureColumns: owner %s, key %s", ownerColl, keyColl)
	}
	if r, err := note(upper, "upper"); err != nil || !r.Applied() {
		t.Fatalf("write by Worker-A: %+v %v", r, err)
	}
	check := func(stage string) {
		t.Helper()
		r, err := note(lower, "lower")
		if err != nil || r.Outcome != fence.Stale || !r.SameFenceOtherOwner {
			t.Fatalf("%s: equal fence from worker-a over Worker-A: %+v %v, want Stale with SameFenceOtherOwner", stage, r, err)
		}
		if _, err := note(fence.Token{Key: "INVOICE:INV_72", Fence: 6, Owner: "worker-a"}, "other key"); !errors.Is(err, fence.ErrWrongKey) {
			t.Fatalf("%s: token of a key that differs in case: %v, want ErrWrongKey", stage, err)
		}
		var got string
		if err := db.QueryRow(`SELECT note FROM jobs WHERE job_id = 'inv_72'`).Scan(&got); err != nil || got != "upper" {
			t.Fatalf("%s: note %q %v, want Worker-A's", stage, got, err)
		}
	}
	check("binary columns")
	// The columns are changed back after the guard checked them: its own
	// comparisons are still byte for byte.
	exec(`ALTER TABLE jobs MODIFY fence_owner VARCHAR(64) CHARACTER SET latin1 COLLATE latin1_swedish_ci NOT NULL DEFAULT '',
  MODIFY fence_key VARCHAR(256) CHARACTER SET latin1 COLLATE latin1_swedish_ci NOT NULL DEFAULT ''`)
	check("columns made case-insensitive again")
}

// TestSQLGuardPostgresPausedTransaction (issue 16, item 12): the pattern
// the README used to show (claim, the slow work and the update in one
// transaction) let a paused holder's write through after its lease ended:
// its open transaction held the row lock, the next holder's claim waited
// behind it, and the late update was applied when the holder resumed. A
// transaction in which the guard wrote a row may now sit idle no longer
// than the guard's Timeout: the server ends it, the next holder's claim
// goes through, and the late update fails.
func TestSQLGuardPostgresPausedTransaction(t *testing.T) {
	if testing.Short() {
		t.Skip("long: a paused transaction past the guard's timeout; run without -short")
	}
	t.Parallel()
	ctx := context.Background()
	pg := testenv.StartPostgres(t)
	e := sqlEnv{db: opentest.DB(t, "pgx", pg.URL()), d: fence.Postgres}
	table := e.jobsTable(t, "inv_72")
	g := e.guard(t, table, nil) // the default Timeout
	a, b := tok(41, "owner-a"), tok(42, "owner-b")

	txA, err := e.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer txA.Rollback()
	if r, err := g.Claim(ctx, txA, "inv_72", a); err != nil || !r.Applied() {
		t.Fatalf("A's claim: %+v %v", r, err)
	}
	// A pauses inside its transaction. Its lease ends; B is granted the key
	// and claims the row, in a transaction of its own.
	bDone := make(chan error, 1)
	go func() {
		bDone <- inTx(t, e.db, func(tx *sql.Tx) error {
			r, err := g.Claim(ctx, tx, "inv_72", b)
			if err == nil && !r.Applied() {
				err = fmt.Errorf("B's claim: %+v", r)
			}
			return err
		})
	}()
	var bErr error
	bFinished := false
	select {
	case bErr = <-bDone:
		bFinished = true
	case <-time.After(15 * time.Second): // three times the guard's default Timeout
		// B is still waiting behind A's lock: A "resumes" now.
	}
	// A resumes and makes the write it had decided on.
	_, updErr := e.send(ctx, g, txA, "inv_72", a)
	commitErr := txA.Commit()
	if !bFinished {
		bErr = <-bDone
	}
	got := e.row(t, table, "inv_72")
	if updErr == nil && commitErr == nil {
		t.Fatalf("A's late update in its paused transaction was committed; row %+v (B finished first: %v)", got, bFinished)
	}
	if bErr != nil || !bFinished {
		t.Fatalf("B's claim: finished while A was paused: %v, err %v", bFinished, bErr)
	}
	if got.status != "PENDING" || got.sends != 0 || got.fence != 42 {
		t.Fatalf("row %+v, want B's claim and no send", got)
	}
}
