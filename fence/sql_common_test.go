package fence_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fence"
)

// sqlEnv is one real database the SQL guard tests run against.
type sqlEnv struct {
	db *sql.DB
	d  fence.Dialect
}

// ph returns the n-th placeholder of the dialect.
func (e sqlEnv) ph(n int) string {
	if e.d == fence.Postgres {
		return fmt.Sprintf("$%d", n)
	}
	return "?"
}

var tableSeq atomic.Int64

// jobsTable creates a fresh invoice_jobs-like table with rows ids (status
// PENDING) and returns its name.
func (e sqlEnv) jobsTable(t *testing.T, ids ...string) string {
	t.Helper()
	name := fmt.Sprintf("invoice_jobs_%d_%d", time.Now().UnixNano()%1e6, tableSeq.Add(1))
	e.exec(t, fmt.Sprintf(`CREATE TABLE %s (job_id VARCHAR(64) PRIMARY KEY, status VARCHAR(16) NOT NULL, sends INTEGER NOT NULL DEFAULT 0, note VARCHAR(64))`, name))
	for _, id := range ids {
		e.exec(t, fmt.Sprintf(`INSERT INTO %s (job_id, status) VALUES (%s, 'PENDING')`, name, e.ph(1)), id)
	}
	return name
}

func (e sqlEnv) exec(t *testing.T, q string, args ...any) {
	t.Helper()
	if _, err := e.db.ExecContext(context.Background(), q, args...); err != nil {
		t.Fatalf("exec %q: %v", q, err)
	}
}

func (e sqlEnv) guard(t *testing.T, table string, hooks func(fenced.Event)) *fence.SQL {
	t.Helper()
	g, err := fence.NewSQL(e.db, e.d, fence.Table{Name: table, Key: "job_id"}, &fence.SQLOptions{Hook: hooks})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.EnsureColumns(context.Background()); err != nil {
		t.Fatal(err)
	}
	return g
}

type rowState struct {
	status string
	sends  int
	fence  int64
	owner  string
	note   sql.NullString
}

func (e sqlEnv) row(t *testing.T, table, id string) rowState {
	t.Helper()
	var r rowState
	err := e.db.QueryRow(fmt.Sprintf(`SELECT status, sends, fence, fence_owner, note FROM %s WHERE job_id = %s`, table, e.ph(1)), id).
		Scan(&r.status, &r.sends, &r.fence, &r.owner, &r.note)
	if err != nil {
		t.Fatalf("read row %s: %v", id, err)
	}
	return r
}

// send is the guarded invoice send: PENDING -> SENT, counting sends.
func (e sqlEnv) send(ctx context.Context, g *fence.SQL, q fence.Querier, id string, tok fence.Token) (fence.Result, error) {
	return g.Update(ctx, q, id, tok, fence.Write{
		Set:       "status = " + e.ph(1) + ", sends = sends + 1",
		SetArgs:   []any{"SENT"},
		Where:     "status = " + e.ph(2),
		WhereArgs: []any{"PENDING"},
	})
}

// note is an unconditional guarded write.
func (e sqlEnv) note(ctx context.Context, g *fence.SQL, q fence.Querier, id string, tok fence.Token, text string) (fence.Result, error) {
	return g.Update(ctx, q, id, tok, fence.Write{Set: "note = " + e.ph(1), SetArgs: []any{text}})
}

func inTx(t *testing.T, db *sql.DB, fn func(tx *sql.Tx) error) error {
	t.Helper()
	tx, err := db.BeginTx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

func tok(f uint64, owner string) fence.Token {
	return fence.Token{Key: "invoice:inv_72", Fence: f, Owner: owner}
}

// runSQLGuardTests runs every dialect-independent SQL guard test.
func runSQLGuardTests(t *testing.T, e sqlEnv) {
	t.Run("Semantics", func(t *testing.T) { testSQLSemantics(t, e) })
	t.Run("OrderingsClaimOff", func(t *testing.T) { testOrdering(t, e, false) })
	t.Run("OrderingsClaimOn", func(t *testing.T) { testOrdering(t, e, true) })
	t.Run("BadInput", func(t *testing.T) { testSQLBadInput(t, e) })
	t.Run("PropertySequential", func(t *testing.T) { testSQLPropertySequential(t, e) })
	t.Run("PropertyConcurrent", func(t *testing.T) { testSQLPropertyConcurrent(t, e) })
	t.Run("Fragments", func(t *testing.T) { testFragments(t, e) })
	t.Run("WrongKey", func(t *testing.T) { testWrongKey(t, e) })
	t.Run("Shape", func(t *testing.T) { testShape(t, e) })
	t.Run("UncheckedGuard", func(t *testing.T) { testUncheckedGuard(t, e) })
	t.Run("ClaimAndRead", func(t *testing.T) { testClaimAndRead(t, e) })
	t.Run("RestartHint", func(t *testing.T) { testRestartHint(t, e) })
	t.Run("Checker", func(t *testing.T) { testChecker(t, e) })
}

func testSQLSemantics(t *testing.T, e sqlEnv) {
	ctx := context.Background()
	table := e.jobsTable(t, "inv_72")
	var stale []fenced.Event
	var mu sync.Mutex
	g := e.guard(t, table, func(ev fenced.Event) {
		if ev.Kind == fenced.EventStaleWrite {
			mu.Lock()
			stale = append(stale, ev)
			mu.Unlock()
		}
	})
	// EnsureColumns twice is harmless.
	if err := g.EnsureColumns(ctx); err != nil {
		t.Fatal(err)
	}
	if err := g.Check(ctx); err != nil {
		t.Fatal(err)
	}
	a, b := tok(41, "owner-a"), tok(42, "owner-b")

	// The same holder writes several times with one fence.
	for i := 0; i < 3; i++ {
		r, err := e.note(ctx, g, nil, "inv_72", a, fmt.Sprintf("a%d", i))
		if err != nil || !r.Applied() || r.Current != 41 {
			t.Fatalf("write %d by holder 41: %+v, %v", i, r, err)
		}
	}
	// Claiming twice with the same token is harmless, also on MySQL where
	// the second claim changes no value.
	for i := 0; i < 2; i++ {
		if r, err := g.Claim(ctx, nil, "inv_72", a); err != nil || !r.Applied() {
			t.Fatalf("claim %d by holder 41: %+v, %v", i, r, err)
		}
	}
	// A newer holder claims; the older is refused with the current fence.
	if r, err := g.Claim(ctx, nil, "inv_72", b); err != nil || !r.Applied() {
		t.Fatalf("claim by 42: %+v, %v", r, err)
	}
	r, err := e.note(ctx, g, nil, "inv_72", a, "late")
	if err != nil {
		t.Fatal(err)
	}
	if r.Outcome != fence.Stale || r.Current != 42 || r.SameFenceOtherOwner {
		t.Fatalf("late write by 41 after claim by 42: %+v, want Stale current 42", r)
	}
	if !errors.Is(r.Err(), fenced.ErrStaleFence) || !errors.Is(r.Err(), fence.ErrStale) {
		t.Fatalf("Err() = %v, want ErrStaleFence", r.Err())
	}
	if got := e.row(t, table, "inv_72"); got.note.String != "a2" || got.fence != 42 || got.owner != "owner-b" {
		t.Fatalf("row after refused write: %+v", got)
	}
	// An equal fence from a different owner is refused.
	r, err = e.note(ctx, g, nil, "inv_72", tok(42, "owner-z"), "impostor")
	if err != nil {
		t.Fatal(err)
	}
	if r.Outcome != fence.Stale || !r.SameFenceOtherOwner || r.Current != 42 {
		t.Fatalf("equal fence other owner: %+v, want Stale with SameFenceOtherOwner", r)
	}
	// The holder sends; a second send is PreconditionFailed, not stale.
	if r, err := e.send(ctx, g, nil, "inv_72", b); err != nil || !r.Applied() {
		t.Fatalf("send by 42: %+v, %v", r, err)
	}
	r, err = e.send(ctx, g, nil, "inv_72", b)
	if err != nil {
		t.Fatal(err)
	}
	if r.Outcome != fence.PreconditionFailed || r.Current != 42 || !errors.Is(r.Err(), fence.ErrPrecondition) {
		t.Fatalf("second send by 42: %+v, want PreconditionFailed", r)
	}
	// A newer holder (43) finds the work done: PreconditionFailed, and the
	// fence is not raised by a write that did not apply.
	r, err = e.send(ctx, g, nil, "inv_72", tok(43, "owner-c"))
	if err != nil {
		t.Fatal(err)
	}
	if r.Outcome != fence.PreconditionFailed || r.Current != 42 {
		t.Fatalf("send by 43 after it was sent: %+v, want PreconditionFailed current 42", r)
	}
	if got := e.row(t, table, "inv_72"); got.sends != 1 || got.status != "SENT" || got.fence != 42 {
		t.Fatalf("row: %+v, want one send with fence 42", got)
	}
	if f, o, err := g.Current(ctx, nil, "inv_72"); err != nil || f != 42 || o != "owner-b" {
		t.Fatalf("Current = %d %q %v", f, o, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(stale) != 2 || stale[0].Fence != 41 || stale[0].Current != 42 || stale[0].Key != "invoice:inv_72" || stale[0].Resource != table {
		t.Fatalf("stale write reports: %+v, want two, first 41 refused by 42 on %s", stale, table)
	}
}

// testOrdering runs the seed's two orderings: A (fence 41) pauses past its
// lease, B (fence 42) acquires and reads the job's state, and A's stale write
// arrives before B's first write.
func testOrdering(t *testing.T, e sqlEnv, claim bool) {
	ctx := context.Background()
	table := e.jobsTable(t, "inv_72")
	g := e.guard(t, table, nil)
	a, b := tok(41, "owner-a"), tok(42, "owner-b")

	// B starts: with claiming on it raises the fence in the transaction in
	// which it reads what it inherits.
	var inherited string
	err := inTx(t, e.db, func(tx *sql.Tx) error {
		if claim {
			r, err := g.Claim(ctx, tx, "inv_72", b)
			if err != nil || !r.Applied() {
				return fmt.Errorf("claim: %+v %v", r, err)
			}
		}
		return tx.QueryRow(fmt.Sprintf("SELECT status FROM %s WHERE job_id = %s", table, e.ph(1)), "inv_72").Scan(&inherited)
	})
	if err != nil {
		t.Fatal(err)
	}
	// A resumes and its stale send lands before any write by B.
	ra, err := e.send(ctx, g, nil, "inv_72", a)
	if err != nil {
		t.Fatal(err)
	}
	// B proceeds from the state it read.
	var rb fence.Result
	if inherited == "PENDING" {
		if rb, err = e.send(ctx, g, nil, "inv_72", b); err != nil {
			t.Fatal(err)
		}
	}
	got := e.row(t, table, "inv_72")
	if !claim {
		// Fencing cannot cancel what arrives first: A's stale write counts,
		// and B's decision, based on the state it read, finds the work done.
		if !ra.Applied() {
			t.Fatalf("claiming off: stale write arriving first was %v, want applied (nothing newer recorded yet)", ra.Outcome)
		}
		if rb.Outcome != fence.PreconditionFailed || got.fence != 41 || got.sends != 1 {
			t.Fatalf("claiming off: B's send %+v, row %+v", rb, got)
		}
		return
	}
	if ra.Outcome != fence.Stale || ra.Current != 42 {
		t.Fatalf("claiming on: stale write arriving first was %+v, want Stale(42)", ra)
	}
	if !rb.Applied() || got.fence != 42 || got.owner != "owner-b" || got.sends != 1 {
		t.Fatalf("claiming on: B's send %+v, row %+v; want B's send applied once", rb, got)
	}
	// And A's write is also refused after B's.
	if r, err := e.send(ctx, g, nil, "inv_72", a); err != nil || r.Outcome != fence.Stale {
		t.Fatalf("claiming on: stale write after B's: %+v %v", r, err)
	}
}

func testSQLBadInput(t *testing.T, e sqlEnv) {
	ctx := context.Background()
	table := e.jobsTable(t, "inv_72")
	g := e.guard(t, table, nil)
	if r, err := e.note(ctx, g, nil, "inv_72", tok(5, "owner-a"), "ok"); err != nil || !r.Applied() {
		t.Fatalf("setup write: %+v %v", r, err)
	}
	before := e.row(t, table, "inv_72")
	unchanged := func(what string) {
		t.Helper()
		if got := e.row(t, table, "inv_72"); got != before {
			t.Fatalf("%s changed the row: %+v -> %+v", what, before, got)
		}
	}
	for _, c := range []struct {
		name string
		tok  fence.Token
		want string
	}{
		{"fence zero", tok(0, "owner-a"), "fence is 0"},
		{"fence overflows int64", tok(math.MaxInt64+1, "owner-a"), "overflows"},
		{"max uint64", tok(math.MaxUint64, "owner-a"), "overflows"},
		{"empty owner", tok(6, ""), "owner is empty"},
		{"owner with space", tok(6, "own er"), "space"},
		{"owner too long", tok(6, strings.Repeat("x", fence.MaxOwnerLen+1)), "longer than"},
	} {
		for _, op := range []string{"claim", "update"} {
			var err error
			if op == "claim" {
				_, err = g.Claim(ctx, nil, "inv_72", c.tok)
			} else {
				_, err = e.note(ctx, g, nil, "inv_72", c.tok, "bad")
			}
			if !errors.Is(err, fence.ErrInvalidToken) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s %s: err = %v, want ErrInvalidToken mentioning %q", op, c.name, err, c.want)
			}
			unchanged(op + " " + c.name)
		}
	}
	// The largest storable fence works (and locks everyone else out).
	table2 := e.jobsTable(t, "inv_1")
	g2 := e.guard(t, table2, nil)
	if r, err := g2.Claim(ctx, nil, "inv_1", tok(math.MaxInt64, "owner-max")); err != nil || !r.Applied() {
		t.Fatalf("claim with MaxInt64: %+v %v", r, err)
	}
	if r, err := g2.Claim(ctx, nil, "inv_1", tok(math.MaxInt64-1, "owner-x")); err != nil || r.Outcome != fence.Stale || r.Current != math.MaxInt64 {
		t.Fatalf("claim below MaxInt64: %+v %v", r, err)
	}

	// A missing row.
	if _, err := g.Claim(ctx, nil, "inv_404", tok(9, "owner-a")); !errors.Is(err, fence.ErrNoRow) || !strings.Contains(err.Error(), "inv_404") {
		t.Errorf("claim on a missing row: %v, want ErrNoRow naming the key", err)
	}
	if _, err := g.Claim(ctx, nil, nil, tok(9, "owner-a")); err == nil || !strings.Contains(err.Error(), "nil") {
		t.Errorf("claim with nil key: %v", err)
	}
	// Args without a fragment.
	if _, err := g.Update(ctx, nil, "inv_72", tok(9, "owner-a"), fence.Write{SetArgs: []any{1}}); err == nil {
		t.Error("SetArgs without Set accepted")
	}
	unchanged("missing row and malformed writes")

	// Missing table.
	missing, err := fence.NewSQL(e.db, e.d, fence.Table{Name: "no_such_table", Key: "job_id"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{
		"EnsureColumns": missing.EnsureColumns(ctx),
		"Check":         missing.Check(ctx),
	} {
		if !errors.Is(err, fence.ErrSchema) || !strings.Contains(err.Error(), "no_such_table") || !strings.Contains(err.Error(), "does not exist") {
			t.Errorf("%s on a missing table: %v, want ErrSchema naming it", name, err)
		}
	}
	if _, err := missing.Claim(ctx, nil, "inv_72", tok(9, "owner-a")); !errors.Is(err, fence.ErrSchema) || !strings.Contains(err.Error(), "no_such_table") {
		t.Errorf("Claim on a missing table: %v, want ErrSchema", err)
	}
	// Missing key column: EnsureColumns refuses and adds nothing.
	badKey, err := fence.NewSQL(e.db, e.d, fence.Table{Name: table, Key: "id"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := badKey.EnsureColumns(ctx); !errors.Is(err, fence.ErrSchema) || !strings.Contains(err.Error(), "key column id") {
		t.Errorf("EnsureColumns with a missing key column: %v", err)
	}
	// Missing fence column (not ensured): Claim says which column.
	plain := e.jobsTable(t, "inv_9")
	noFence, err := fence.NewSQL(e.db, e.d, fence.Table{Name: plain, Key: "job_id"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := noFence.Claim(ctx, nil, "inv_9", tok(9, "owner-a")); !errors.Is(err, fence.ErrSchema) || !strings.Contains(err.Error(), "no column fence, fence_owner, fence_key") {
		t.Errorf("Claim without fence columns: %v, want ErrSchema naming the three columns", err)
	}
	var n int
	if err := e.db.QueryRow(fmt.Sprintf("SELECT COUNT(*) FROM %s WHERE status = 'PENDING'", plain)).Scan(&n); err != nil || n != 1 {
		t.Errorf("plain table changed: %d %v", n, err)
	}
	if err := badKey.Check(ctx); !errors.Is(err, fence.ErrSchema) || !strings.Contains(err.Error(), "no column id") {
		t.Errorf("Check with a missing key column: %v", err)
	}

	// Identifiers are validated, never spliced.
	for _, tbl := range []fence.Table{
		{Name: "jobs; DROP TABLE x", Key: "id"},
		{Name: "jobs", Key: `id"`},
		{Name: "a.b.c", Key: "id"},
		{Name: "", Key: "id"},
		{Name: "jobs", Key: "id", FenceColumn: "f-1"},
		{Name: "jobs", Key: "id", FenceColumn: "same", OwnerColumn: "same"},
		{Name: strings.Repeat("t", 64), Key: "id"},
	} {
		if _, err := fence.NewSQL(e.db, e.d, tbl, nil); !errors.Is(err, fence.ErrSchema) {
			t.Errorf("NewSQL(%+v) = %v, want ErrSchema", tbl, err)
		}
	}
	if _, err := fence.NewSQL(e.db, fence.Dialect(99), fence.Table{Name: "jobs", Key: "id"}, nil); err == nil {
		t.Error("unknown dialect accepted")
	}

	// A negative fence written behind the guard's back is reported, and the
	// CHECK constraint added by EnsureColumns refuses to store one.
	_, err = e.db.Exec(fmt.Sprintf("UPDATE %s SET fence = -3 WHERE job_id = %s", table, e.ph(1)), "inv_72")
	if err == nil {
		t.Errorf("the fence column accepted a negative value")
	}
	unchanged("negative fence")

	// A fence column created by hand without the CHECK, holding a negative
	// value: refused with a clear error, nothing written.
	hand := fmt.Sprintf("hand_%d", tableSeq.Add(1))
	e.exec(t, fmt.Sprintf("CREATE TABLE %s (job_id VARCHAR(64) PRIMARY KEY, note VARCHAR(64), fence BIGINT, fence_owner VARCHAR(64))", hand))
	e.exec(t, fmt.Sprintf("INSERT INTO %s (job_id, note, fence, fence_owner) VALUES ('j', 'orig', -3, 'x')", hand))
	gh, err := fence.NewSQL(e.db, e.d, fence.Table{Name: hand, Key: "job_id"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// EnsureColumns adds the lease key column (and on MySQL converts the
	// owner column to a binary collation) but keeps the fence column as is.
	if err := gh.EnsureColumns(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := gh.Update(ctx, nil, "j", tok(5, "owner-a"), fence.Write{Set: "note = " + e.ph(1), SetArgs: []any{"new"}}); !errors.Is(err, fence.ErrSchema) || !strings.Contains(err.Error(), "negative fence -3") {
		t.Errorf("write over a negative fence: %v, want ErrSchema naming it", err)
	}
	var note string
	if err := e.db.QueryRow(fmt.Sprintf("SELECT note FROM %s WHERE job_id = 'j'", hand)).Scan(&note); err != nil || note != "orig" {
		t.Errorf("row with negative fence changed: %q %v", note, err)
	}
	// A NULL fence counts as 0 (a column added by hand without a default).
	e.exec(t, fmt.Sprintf("INSERT INTO %s (job_id, note) VALUES ('k', 'orig')", hand))
	if r, err := gh.Claim(ctx, nil, "k", tok(1, "owner-a")); err != nil || !r.Applied() {
		t.Errorf("claim over a NULL fence: %+v %v", r, err)
	}
}

// testSQLPropertySequential: for random sequences of writes carrying (fence,
// owner), every outcome is the one the model predicts, and the row itself
// (read with plain SQL after every write, not through the guard) changes
// exactly when a write is reported applied, never goes back in fence order
// and never records a second owner at one fence.
func testSQLPropertySequential(t *testing.T, e sqlEnv) {
	ctx := context.Background()
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 1))
	table := e.jobsTable(t)
	g := e.guard(t, table, nil)
	rounds, steps := 30, 25
	for round := 0; round < rounds; round++ {
		id := fmt.Sprintf("job_%d", round)
		e.exec(t, fmt.Sprintf(`INSERT INTO %s (job_id, status) VALUES (%s, 'PENDING')`, table, e.ph(1)), id)
		var modelFence uint64
		var modelOwner string
		prev := e.row(t, table, id)
		for step := 0; step < steps; step++ {
			tk := fence.Token{Key: "job:" + id, Fence: 1 + rng.Uint64N(8), Owner: fmt.Sprintf("o%d", rng.IntN(3))}
			marker := fmt.Sprint("step-", step)
			var r fence.Result
			var err error
			claim := rng.IntN(3) == 0
			if claim {
				r, err = g.Claim(ctx, nil, id, tk)
			} else {
				r, err = e.note(ctx, g, nil, id, tk, marker)
			}
			if err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
			wantApplied := tk.Fence > modelFence || (tk.Fence == modelFence && tk.Owner == modelOwner)
			if r.Applied() != wantApplied {
				t.Fatalf("seed %d round %d step %d: %v on row (%d,%s): got %+v, want applied=%v", seed, round, step, tk, modelFence, modelOwner, r, wantApplied)
			}
			if wantApplied {
				modelFence, modelOwner = tk.Fence, tk.Owner
			} else if r.Outcome != fence.Stale || r.Current != modelFence {
				t.Fatalf("seed %d: refusal of %v classified %+v, want Stale(%d)", seed, tk, r, modelFence)
			}
			// What the database holds now.
			got := e.row(t, table, id)
			switch {
			case r.Applied() && (got.fence != int64(tk.Fence) || got.owner != tk.Owner || (!claim && got.note.String != marker)):
				t.Fatalf("seed %d: %v reported applied, but the row holds %+v", seed, tk, got)
			case !r.Applied() && got != prev:
				t.Fatalf("seed %d: %v reported %v, but the row changed: %+v -> %+v", seed, tk, r.Outcome, prev, got)
			case got.fence < prev.fence || (got.fence == prev.fence && prev.fence != 0 && got.owner != prev.owner):
				t.Fatalf("seed %d: the row went back: (%d,%s) after (%d,%s)", seed, got.fence, got.owner, prev.fence, prev.owner)
			}
			prev = got
		}
	}
}

// testSQLPropertyConcurrent: writers race on one row, each in its own
// transaction that also appends to a log table; the log (commit order)
// never goes back in fence order and never mixes owners at one fence.
func testSQLPropertyConcurrent(t *testing.T, e sqlEnv) {
	ctx := context.Background()
	table := e.jobsTable(t, "hot")
	logTable := table + "_log"
	idCol := "seq INTEGER PRIMARY KEY AUTOINCREMENT"
	switch e.d {
	case fence.Postgres:
		idCol = "seq BIGSERIAL PRIMARY KEY"
	case fence.MySQL:
		idCol = "seq BIGINT AUTO_INCREMENT PRIMARY KEY"
	}
	e.exec(t, fmt.Sprintf("CREATE TABLE %s (%s, fence BIGINT NOT NULL, owner VARCHAR(64) NOT NULL)", logTable, idCol))
	g := e.guard(t, table, nil)
	var wg sync.WaitGroup
	var applied atomic.Int64
	errs := make(chan error, 64)
	for w := 0; w < 6; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for i := 0; i < 25; i++ {
				tk := fence.Token{Key: "hot", Fence: 1 + rng.Uint64N(40), Owner: fmt.Sprintf("w%d", rng.IntN(2))}
				err := retryBusy(func() error {
					tx, err := e.db.BeginTx(ctx, nil)
					if err != nil {
						return err
					}
					defer tx.Rollback()
					r, err := e.note(ctx, g, tx, "hot", tk, "x")
					if err != nil {
						return err
					}
					if r.Applied() {
						if _, err := tx.ExecContext(ctx, fmt.Sprintf("INSERT INTO %s (fence, owner) VALUES (%s, %s)", logTable, e.ph(1), e.ph(2)), int64(tk.Fence), tk.Owner); err != nil {
							return err
						}
					}
					if err := tx.Commit(); err != nil {
						return err
					}
					if r.Applied() {
						applied.Add(1)
					}
					return nil
				})
				if err != nil {
					errs <- err
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	rows, err := e.db.Query(fmt.Sprintf("SELECT fence, owner FROM %s ORDER BY seq", logTable))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var prevF int64
	var prevO string
	n := 0
	for rows.Next() {
		var f int64
		var o string
		if err := rows.Scan(&f, &o); err != nil {
			t.Fatal(err)
		}
		if f < prevF || (f == prevF && o != prevO) {
			t.Fatalf("commit order went back: (%d,%s) after (%d,%s)", f, o, prevF, prevO)
		}
		prevF, prevO = f, o
		n++
	}
	if int64(n) != applied.Load() || n == 0 {
		t.Fatalf("log has %d entries, %d writes applied", n, applied.Load())
	}
	if got := e.row(t, table, "hot"); got.fence != prevF || got.owner != prevO {
		t.Fatalf("row holds (%d,%s), last logged (%d,%s)", got.fence, got.owner, prevF, prevO)
	}
}

// retryBusy retries fn on lock conflicts and deadlocks that the database
// resolves by aborting one transaction (not a guard failure).
func retryBusy(fn func() error) error {
	var err error
	for i := 0; i < 200; i++ {
		err = fn()
		if err == nil {
			return nil
		}
		msg := strings.ToLower(err.Error())
		if !strings.Contains(msg, "deadlock") && !strings.Contains(msg, "busy") && !strings.Contains(msg, "locked") && !strings.Contains(msg, "could not serialize") {
			return err
		}
		time.Sleep(time.Duration(1+i) * time.Millisecond)
	}
	return err
}
