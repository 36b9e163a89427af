package intent_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fence"
	"github.com/fenced-dev/fenced/fencedsqlite"
	"github.com/fenced-dev/fenced/intent"
	"github.com/fenced-dev/fenced/internal/testkit/payprovider"
)

// dbTests run on SQLite (TestSQLite) and on PostgreSQL and MariaDB
// (TestServers). db nil means the env's own SQLite file.
var dbTests = []struct {
	name string
	run  func(t *testing.T, db *sql.DB, d fence.Dialect)
}{
	{"Namespaces", testNamespaces},
	{"OldShape", testOldShape},
	{"FoldingCollations", testFoldingCollations},
	{"IDsCompareBytes", testIDsCompareBytes},
	{"ConcurrentCreate", testConcurrentCreate},
	{"ReconcileRotates", testReconcileRotates},
	{"RejectedThenRetried", testRejectedThenRetried},
}

func TestSQLite(t *testing.T) {
	for _, tc := range dbTests {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, nil, 0) })
	}
}

// testNamespaces: stores with different namespaces share a table and an
// id without sharing intents. Before namespaces were part of the key, the
// payout Create("42") returned the refund (or ErrConflict), and the payout
// was never made.
func testNamespaces(t *testing.T, db *sql.DB, d fence.Dialect) {
	ctx := context.Background()
	table := uniqueTable()
	e := newEnvWith(t, db, d, &intent.Options{Table: table, Namespace: "refunds"})
	refunds := e.store
	payouts := e.newStore(t, &intent.Options{Table: table, Namespace: "payouts"})

	r, created, err := refunds.Create(ctx, "42", `{"refund_cents":100}`)
	if err != nil || !created {
		t.Fatalf("refund Create: %+v %v %v", r, created, err)
	}
	p, created, err := payouts.Create(ctx, "42", `{"payout_cents":900}`)
	if err != nil || !created {
		t.Fatalf("payout Create of the same id: %+v created=%v %v, want a new intent", p, created, err)
	}
	if p.Namespace != "payouts" || p.Payload != `{"payout_cents":900}` || p.IdempotencyKey != intent.DeriveKey("payouts", "42") || p.IdempotencyKey == r.IdempotencyKey {
		t.Fatalf("payout intent %+v (refund %+v)", p, r)
	}
	// Progress on one does not move the other.
	if _, err := refunds.Begin(ctx, "42", tk(3, "a")); err != nil {
		t.Fatal(err)
	}
	if err := refunds.Complete(ctx, "42", tk(3, "a"), "re_1"); err != nil {
		t.Fatal(err)
	}
	if got, err := payouts.Get(ctx, "42"); err != nil || got.State != intent.Pending || got.Ref != "" || got.Fence != 0 {
		t.Fatalf("payout after the refund completed: %+v %v", got, err)
	}
	if _, err := payouts.Begin(ctx, "42", tk(1, "b")); err != nil {
		t.Fatalf("payout Begin with a fence below the refund's: %v", err)
	}
	// Stuck sees its own namespace only.
	time.Sleep(5 * time.Millisecond)
	if st, err := refunds.Stuck(ctx, 0, 0); err != nil || len(st) != 0 {
		t.Fatalf("refunds Stuck: %+v %v", st, err)
	}
	if st, err := payouts.Stuck(ctx, 0, 0); err != nil || len(st) != 1 || st[0].Namespace != "payouts" {
		t.Fatalf("payouts Stuck: %+v %v", st, err)
	}
	if _, err := payouts.Claim(ctx, nil, "404", tk(9, "b")); !errors.Is(err, intent.ErrNotFound) {
		t.Fatalf("Claim of a missing intent: %v", err)
	}
	if res, err := payouts.Claim(ctx, nil, "42", tk(2, "c")); err != nil || res.Outcome != fence.Applied {
		t.Fatalf("Claim: %+v %v", res, err)
	}
	if got, _ := refunds.Get(ctx, "42"); got.State != intent.Submitted || got.Ref != "re_1" || got.Fence != 3 {
		t.Fatalf("refund at the end: %+v", got)
	}
	for _, bad := range []string{"has space", "tab\tx", strings.Repeat("n", intent.MaxNamespaceLen+1), "né"} {
		if _, err := intent.New(e.db, e.d, &intent.Options{Namespace: bad}); err == nil || !strings.Contains(err.Error(), "namespace") {
			t.Errorf("namespace %q: %v", bad, err)
		}
	}
}

// oldTableSQL is the intent table as earlier versions created it: id the
// only key, no namespace.
func oldTableSQL(d fence.Dialect, table string) string {
	idType, text, long := "TEXT", "TEXT", "TEXT"
	if d == fence.MySQL {
		idType, text, long = "VARCHAR(255)", "VARCHAR(1024)", "MEDIUMTEXT"
	}
	return fmt.Sprintf(`CREATE TABLE %s (
  id %s PRIMARY KEY,
  idempotency_key %s NOT NULL UNIQUE,
  state VARCHAR(16) NOT NULL CHECK (state IN ('pending', 'submitting', 'submitted', 'failed')),
  payload %s NOT NULL,
  ref %s NOT NULL DEFAULT '',
  reason %s NOT NULL DEFAULT '',
  attempts INTEGER NOT NULL DEFAULT 0,
  created_ms BIGINT NOT NULL,
  updated_ms BIGINT NOT NULL,
  fence BIGINT NOT NULL DEFAULT 0 CHECK (fence >= 0),
  fence_owner VARCHAR(64) NOT NULL DEFAULT ''
)`, table, idType, idType, long, text, text)
}

// testOldShape: an intent table from before namespaces is refused with an
// error naming the differences, and the migration in the package
// documentation turns it into one that works, keeping every row in the
// namespace that created it.
func testOldShape(t *testing.T, db *sql.DB, d fence.Dialect) {
	ctx := context.Background()
	e := newEnvWith(t, db, d, &intent.Options{Table: uniqueTable()})
	table := uniqueTable()
	mustExec(t, e.db, oldTableSQL(e.d, table))
	mustExec(t, e.db, fmt.Sprintf(`INSERT INTO %s (id, idempotency_key, state, payload, ref, attempts, created_ms, updated_ms, fence, fence_owner)
VALUES ('po_1', '%s', 'submitted', 'x', 'pay_9', 1, 1, 2, 7, 'owner-a'), ('r_1', '%s', 'pending', 'y', '', 0, 3, 3, 0, '')`,
		table, intent.DeriveKey("fenced", "po_1"), intent.DeriveKey("my-refunds", "r_1")))

	store, err := intent.New(e.db, e.d, &intent.Options{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	err = store.EnsureTable(ctx)
	if !errors.Is(err, intent.ErrSchema) {
		t.Fatalf("EnsureTable on an old table: %v, want ErrSchema", err)
	}
	for _, want := range []string{table, "primary key is (id), want (namespace, id)", "missing column namespace, create_token, checked_ms", "Upgrading a table from before namespaces"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	// Nothing was changed.
	if _, err := e.db.ExecContext(ctx, "SELECT namespace FROM "+table); err == nil {
		t.Fatal("the refused table gained a namespace column")
	}

	// The documented migration.
	length := "LENGTH"
	if e.d == fence.MySQL {
		length = "CHAR_LENGTH"
	}
	mustExec(t, e.db, fmt.Sprintf("ALTER TABLE %s RENAME TO %s_old", table, table))
	if err := store.EnsureTable(ctx); err != nil {
		t.Fatal(err)
	}
	mustExec(t, e.db, fmt.Sprintf(`INSERT INTO %[1]s (namespace, id, idempotency_key, create_token, state, payload,
    ref, reason, attempts, created_ms, updated_ms, checked_ms, fence, fence_owner)
  SELECT SUBSTR(idempotency_key, 1, %[2]s(idempotency_key) - 33), id, idempotency_key,
    'migrated', state, payload, ref, reason, attempts, created_ms, updated_ms, 0, fence, fence_owner
  FROM %[1]s_old`, table, length))
	mustExec(t, e.db, fmt.Sprintf("DROP TABLE %s_old", table))

	if it, err := store.Get(ctx, "po_1"); err != nil || it.State != intent.Submitted || it.Ref != "pay_9" || it.Fence != 7 || it.Namespace != "fenced" {
		t.Fatalf("migrated po_1: %+v %v", it, err)
	}
	if _, err := store.Get(ctx, "r_1"); !errors.Is(err, intent.ErrNotFound) {
		t.Fatalf("r_1 belongs to my-refunds, but the default namespace found it: %v", err)
	}
	refunds := e.newStore(t, &intent.Options{Table: table, Namespace: "my-refunds"})
	if it, err := refunds.Get(ctx, "r_1"); err != nil || it.State != intent.Pending || it.Payload != "y" {
		t.Fatalf("migrated r_1: %+v %v", it, err)
	}
	if _, created, err := store.Create(ctx, "r_1", "z"); err != nil || !created {
		t.Fatalf("Create r_1 in the default namespace after the migration: %v %v", created, err)
	}
	if _, created, err := refunds.Create(ctx, "r_1", "y"); err != nil || created {
		t.Fatalf("Create of a migrated intent: created=%v %v", created, err)
	}
}

// testFoldingCollations: a table whose key columns compare with a collation
// that folds case or ignores trailing spaces would merge distinct intents;
// EnsureTable refuses it and names the column and collation.
func testFoldingCollations(t *testing.T, db *sql.DB, d fence.Dialect) {
	ctx := context.Background()
	e := newEnvWith(t, db, d, &intent.Options{Table: uniqueTable()})
	var folding []struct{ idType, want string }
	switch e.d {
	case fence.SQLite:
		folding = append(folding,
			struct{ idType, want string }{"TEXT COLLATE NOCASE", "COLLATE NOCASE"},
			struct{ idType, want string }{"TEXT COLLATE RTRIM", "COLLATE RTRIM"})
	case fence.Postgres:
		mustExec(t, e.db, `DO $$ BEGIN
  CREATE COLLATION fenced_test_ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
EXCEPTION WHEN duplicate_object THEN NULL; END $$`)
		folding = append(folding,
			struct{ idType, want string }{"TEXT COLLATE fenced_test_ci", "nondeterministic collation fenced_test_ci"},
			struct{ idType, want string }{"CHAR(255)", "pads with spaces"})
	case fence.MySQL:
		folding = append(folding,
			struct{ idType, want string }{"VARCHAR(255) CHARACTER SET latin1 COLLATE latin1_swedish_ci", "latin1_swedish_ci"},
			struct{ idType, want string }{"VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin", "utf8mb4_bin"})
	}
	for _, f := range folding {
		table := uniqueTable()
		mustExec(t, e.db, handMadeSQL(e.d, table, f.idType))
		store, err := intent.New(e.db, e.d, &intent.Options{Table: table})
		if err != nil {
			t.Fatal(err)
		}
		err = store.EnsureTable(ctx)
		if !errors.Is(err, intent.ErrSchema) || !strings.Contains(err.Error(), f.want) {
			t.Errorf("id %s: EnsureTable = %v, want ErrSchema naming %q", f.idType, err, f.want)
		}
	}
	// The same hand-made table with a byte-comparing id is accepted.
	good := map[fence.Dialect]string{fence.SQLite: "TEXT", fence.Postgres: "TEXT", fence.MySQL: "VARBINARY(255)"}[e.d]
	table := uniqueTable()
	mustExec(t, e.db, handMadeSQL(e.d, table, good))
	e.newStore(t, &intent.Options{Table: table})
}

// handMadeSQL is the current intent table with the id column of type
// idType, as an operator might write it in a migration.
func handMadeSQL(d fence.Dialect, table, idType string) string {
	ident, owner := "TEXT", "TEXT"
	if d == fence.MySQL {
		ident, owner = "VARBINARY(255)", "VARBINARY(64)"
	}
	return fmt.Sprintf(`CREATE TABLE %s (
  namespace %s NOT NULL, id %s NOT NULL, idempotency_key %s NOT NULL UNIQUE, create_token %s NOT NULL,
  state VARCHAR(16) NOT NULL, payload TEXT NOT NULL, ref VARCHAR(255) NOT NULL DEFAULT '', reason VARCHAR(255) NOT NULL DEFAULT '',
  attempts INTEGER NOT NULL DEFAULT 0, created_ms BIGINT NOT NULL, updated_ms BIGINT NOT NULL, checked_ms BIGINT NOT NULL DEFAULT 0,
  fence BIGINT NOT NULL DEFAULT 0, fence_owner %s NOT NULL DEFAULT '',
  PRIMARY KEY (namespace, id))`, table, ident, idType, ident, ident, owner)
}

// testIDsCompareBytes: ids that differ only in case or trailing spaces are
// different intents. On MariaDB with its default latin1_swedish_ci, the
// earlier table (VARCHAR ids) returned po_1's intent for "PO_1" and po_2's
// for "po_2 ", losing those side effects.
func testIDsCompareBytes(t *testing.T, db *sql.DB, d fence.Dialect) {
	ctx := context.Background()
	e := newEnvWith(t, db, d, &intent.Options{Table: uniqueTable()})
	ids := []string{"po_1", "PO_1", "po_2", "po_2 ", "po_3é", "po_3e"}
	for i, id := range ids {
		it, created, err := e.store.Create(ctx, id, fmt.Sprintf(`{"n":%d}`, i))
		if err != nil || !created || it.ID != id || it.IdempotencyKey != intent.DeriveKey(intent.DefaultNamespace, id) {
			t.Fatalf("Create(%q): %+v created=%v %v, want a new intent", id, it, created, err)
		}
	}
	for i, id := range ids {
		if it, err := e.store.Get(ctx, id); err != nil || it.ID != id || it.Payload != fmt.Sprintf(`{"n":%d}`, i) {
			t.Errorf("Get(%q): %+v %v", id, it, err)
		}
	}
	if _, err := e.store.Begin(ctx, "PO_1", tk(5, "a")); err != nil {
		t.Fatal(err)
	}
	if it, _ := e.store.Get(ctx, "po_1"); it.State != intent.Pending || it.Fence != 0 {
		t.Fatalf("po_1 moved with PO_1: %+v", it)
	}
}

// testConcurrentCreate: of many concurrent Creates of one id exactly one
// reports created, and every one returns the same intent.
func testConcurrentCreate(t *testing.T, db *sql.DB, d fence.Dialect) {
	ctx := context.Background()
	e := newEnvWith(t, db, d, &intent.Options{Table: uniqueTable()})
	const n = 8
	var wg sync.WaitGroup
	created := make([]bool, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, created[i], errs[i] = e.store.Create(ctx, "po_c", "same")
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if k := len(slices.DeleteFunc(created, func(c bool) bool { return !c })); k != 1 {
		t.Fatalf("%d Creates reported created, want 1", k)
	}
}

// testReconcileRotates: two stuck intents whose lease stays held and one
// whose lookup keeps answering Unknown cannot hide the others from a
// Reconciler with a small Limit. Before, Stuck ordered by updated_ms only
// and nothing recorded the examination, so the same oldest intents filled
// every run and the others were never looked at.
func testReconcileRotates(t *testing.T, db *sql.DB, d fence.Dialect) {
	ctx := context.Background()
	e := newEnvWith(t, db, d, &intent.Options{Table: uniqueTable()})
	s := e.store
	leaseKey := func(id string) string { return "payout:" + id }
	ids := []string{"held_1", "held_2", "unknown", "paid", "absent"}
	for _, id := range ids {
		if _, _, err := s.Create(ctx, id, "x"); err != nil {
			t.Fatal(err)
		}
		l, err := e.leases.Acquire(ctx, leaseKey(id), nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Begin(ctx, id, fence.From(l)); err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(id, "held") {
			defer l.Release(ctx) // its worker is still active
		} else {
			l.Release(ctx)
		}
		time.Sleep(3 * time.Millisecond) // distinct updated_ms, in this order
	}
	var looked []string
	rec := &intent.Reconciler{
		Store: s, Leases: e.leases, LeaseKey: leaseKey, StuckFor: time.Millisecond, Limit: 2,
		Lookup: func(ctx context.Context, it intent.Intent) (intent.Answer, error) {
			looked = append(looked, it.ID)
			switch it.ID {
			case "paid":
				return intent.Answer{Finding: intent.Done, Ref: "pay_5"}, nil
			case "absent":
				return intent.Answer{Finding: intent.Absent}, nil
			}
			return intent.Answer{Finding: intent.Unknown}, nil
		},
	}
	time.Sleep(5 * time.Millisecond)
	var total intent.Report
	for range 3 {
		rep, err := rec.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Examined != 2 {
			t.Fatalf("run examined %d, want 2 (Limit)", rep.Examined)
		}
		total.Skipped += rep.Skipped
		total.Unknown += rep.Unknown
		total.Submitted += rep.Submitted
		total.Reopened += rep.Reopened
		time.Sleep(2 * time.Millisecond) // distinct checked_ms between runs
	}
	if total.Submitted != 1 || total.Reopened != 1 || total.Skipped < 2 || !slices.Contains(looked, "unknown") {
		t.Fatalf("after 3 runs of 2: %+v, lookups %v; every stuck intent should have had a turn", total, looked)
	}
	if it, _ := s.Get(ctx, "paid"); it.State != intent.Submitted || it.Checked.IsZero() {
		t.Fatalf("paid: %+v", it)
	}
	if it, _ := s.Get(ctx, "absent"); it.State != intent.Pending {
		t.Fatalf("absent: %+v", it)
	}
	// What is left rotates: the least recently examined comes first.
	st, err := s.Stuck(ctx, 0, 0)
	if err != nil || len(st) != 3 {
		t.Fatalf("Stuck: %+v %v", st, err)
	}
	for i := 1; i < len(st); i++ {
		if st[i].Checked.Before(st[i-1].Checked) {
			t.Fatalf("Stuck not ordered by last examination: %+v", st)
		}
	}
}

// testRejectedThenRetried: a worker whose provider call was rejected dies
// before recording it; the next worker retries with the same idempotency
// key, gets the rejection replayed, and records the intent as failed.
// Before, the provider replayed the rejection as 200 with an empty
// reference, and the intent was recorded submitted with no payment.
func testRejectedThenRetried(t *testing.T, db *sql.DB, d fence.Dialect) {
	ctx := context.Background()
	e := newEnvWith(t, db, d, &intent.Options{Table: uniqueTable()})
	s := e.store
	provider := payprovider.Start()
	defer provider.Close()
	pay := &payprovider.Client{URL: provider.URL()}
	if _, _, err := s.Create(ctx, "po_r", `{"amount_cents":-5}`); err != nil {
		t.Fatal(err)
	}
	attempt := func(record bool) error {
		l, err := e.leases.Acquire(ctx, "payout:po_r", nil)
		if err != nil {
			return err
		}
		defer l.Release(ctx)
		tok := fence.From(l)
		it, err := s.Begin(ctx, "po_r", tok)
		if err != nil {
			return err
		}
		ref, err := pay.Pay(ctx, it.IdempotencyKey, it.ID, -5)
		if !record {
			return err // the worker dies before recording anything
		}
		switch {
		case errors.Is(err, payprovider.ErrRejected):
			return s.Fail(ctx, "po_r", tok, err.Error())
		case err != nil:
			return err
		}
		return s.Complete(ctx, "po_r", tok, ref)
	}
	if err := attempt(false); !errors.Is(err, payprovider.ErrRejected) {
		t.Fatalf("first attempt: %v, want a rejection", err)
	}
	if err := attempt(true); err != nil {
		t.Fatalf("retry: %v", err)
	}
	it, err := s.Get(ctx, "po_r")
	if err != nil || it.State != intent.Failed || !strings.Contains(it.Reason, "not positive") || it.Ref != "" || it.Attempts != 2 {
		t.Fatalf("after the retry: %+v %v, want failed with the provider's reason", it, err)
	}
	if n := len(provider.Payouts()); n != 0 {
		t.Fatalf("provider paid %d times", n)
	}
	// An empty reference is never recorded as a success.
	s.Create(ctx, "po_e", "x")
	if _, err := s.Begin(ctx, "po_e", tk(1, "a")); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, "po_e", tk(1, "a"), ""); err == nil || !strings.Contains(err.Error(), "empty provider reference") {
		t.Fatalf("Complete with an empty ref: %v", err)
	}
	if it, _ := s.Get(ctx, "po_e"); it.State != intent.Submitting {
		t.Fatalf("after a refused empty ref: %+v", it)
	}
}

func mustExec(t *testing.T, db *sql.DB, q string, args ...any) {
	t.Helper()
	if _, err := db.ExecContext(context.Background(), q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// TestStaleReportedToLeaseClient: a store without Hooks reports a stale
// transition to the hooks of the client that granted the lease.
func TestStaleReportedToLeaseClient(t *testing.T) {
	ctx := context.Background()
	drv, err := fencedsqlite.OpenFile(ctx, filepath.Join(t.TempDir(), "app.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	var stale []fenced.Event
	leases := fenced.NewClient(drv, &fenced.Options{Hook: func(e fenced.Event) {
		if e.Kind == fenced.EventStaleWrite {
			stale = append(stale, e)
		}
	}})
	defer leases.Close()
	s, err := intent.New(drv.DB(), fence.SQLite, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.EnsureTable(ctx); err != nil {
		t.Fatal(err)
	}
	s.Create(ctx, "po_1", "x")
	begin := func() fence.Token {
		l, err := leases.TryAcquire(ctx, "payout:po_1", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release(ctx)
		if _, err := s.Begin(ctx, "po_1", fence.From(l)); err != nil {
			t.Fatal(err)
		}
		return fence.From(l)
	}
	old, _ := begin(), begin()
	if err := s.Complete(ctx, "po_1", old, "pay_1"); !errors.Is(err, fenced.ErrStaleFence) {
		t.Fatalf("stale Complete: %v", err)
	}
	if len(stale) != 1 || stale[0].Fence != old.Fence || stale[0].Resource != intent.DefaultTable {
		t.Fatalf("client hooks got %+v", stale)
	}
}
