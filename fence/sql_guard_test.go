package fence_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"github.com/fenced-dev/fenced/internal/core/limits"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fence"
)

// identityCols is the definition of the guard's owner and lease key
// columns as a careful migration would write them for e's dialect.
func (e sqlEnv) identityCols() string {
	if e.d == fence.MySQL {
		return "fence_owner VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '', fence_key VARCHAR(256) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT ''"
	}
	return "fence_owner TEXT NOT NULL DEFAULT '', fence_key TEXT NOT NULL DEFAULT ''"
}

// uniqueName returns a fresh table name.
func uniqueName(prefix string) string {
	return fmt.Sprintf("%s_%d_%d", prefix, time.Now().UnixNano()%1e6, tableSeq.Add(1))
}

// testFragments (issue 16, items 1 and 7): a Set or Where fragment cannot
// change the statement's structure. On the old code a "--" comment in Set
// commented out the key match and the fence check (SQLite applied a stale
// token, to every row), and a Where of "1=1) OR (1=1" escaped its brackets
// on every dialect.
func testFragments(t *testing.T, e sqlEnv) {
	ctx := context.Background()
	table := e.jobsTable(t, "inv_72", "inv_73")
	g := e.guard(t, table, nil)
	cur, stale := tok(42, "owner-b"), tok(41, "owner-a")
	for _, id := range []string{"inv_72", "inv_73"} {
		if r, err := g.Claim(ctx, nil, id, cur); err != nil || !r.Applied() {
			t.Fatalf("claim %s: %+v %v", id, r, err)
		}
	}
	before := map[string]rowState{"inv_72": e.row(t, table, "inv_72"), "inv_73": e.row(t, table, "inv_73")}
	unchanged := func(what string) {
		t.Helper()
		for id, b := range before {
			if got := e.row(t, table, id); got != b {
				t.Fatalf("%s changed row %s: %+v -> %+v", what, id, b, got)
			}
		}
	}
	p1, p2 := e.ph(1), e.ph(2)
	cases := []struct {
		name string
		w    fence.Write
		want string
	}{
		{"comment in Set", fence.Write{Set: "status = " + p1 + " -- mark sent", SetArgs: []any{"SENT"}}, "comment"},
		{"comment in Where", fence.Write{Set: "status = " + p1, SetArgs: []any{"SENT"}, Where: "1=1 -- anything"}, "comment"},
		{"Where escapes its brackets", fence.Write{Set: "status = " + p1, SetArgs: []any{"SENT"}, Where: "1=1) OR (1=1"}, "unbalanced"},
		{"block comment", fence.Write{Set: "status = 'SENT' /* x */"}, "comment"},
		{"semicolon", fence.Write{Set: "status = 'SENT'; DELETE FROM " + table}, "semicolon"},
		{"bracket never closed", fence.Write{Set: "status = 'SENT'", Where: "(status = 'PENDING'"}, "never closed"},
		{"mismatched brackets", fence.Write{Set: "status = 'SENT'", Where: "(status = 'PENDING']"}, "unbalanced"},
		{"unterminated literal", fence.Write{Set: "note = 'open"}, "unterminated"},
		{"backslash", fence.Write{Set: `note = 'a\' OR 1=1`}, "backslash"},
		{"control character", fence.Write{Set: "note = 'a\x00'"}, "NUL"},
		{"placeholder without argument", fence.Write{Set: "status = " + p1}, "argument"},
		{"argument without placeholder", fence.Write{Set: "status = " + p1, SetArgs: []any{"SENT", "extra"}}, "argument"},
		{"Where arguments short", fence.Write{Set: "status = " + p1, SetArgs: []any{"SENT"}, Where: "status = " + p2 + " OR status = " + e.ph(3), WhereArgs: []any{"PENDING"}}, "argument"},
		{"Set assigns the fence", fence.Write{Set: "fence = 999"}, "guard's own columns"},
		{"Set assigns the owner", fence.Write{Set: "status = 'SENT', fence_owner = 'x'"}, "guard's own columns"},
		{"Set assigns the lease key", fence.Write{Set: "fence_key = 'batch:all'"}, "guard's own columns"},
		{"args without Set", fence.Write{SetArgs: []any{1}}, "without Set"},
	}
	switch e.d {
	case fence.Postgres:
		cases = append(cases,
			struct {
				name string
				w    fence.Write
				want string
			}{"? with PostgreSQL", fence.Write{Set: "status = ?", SetArgs: []any{"SENT"}, Where: "status = ?", WhereArgs: []any{"PENDING"}}, "PostgreSQL numbers them: write $1"},
			struct {
				name string
				w    fence.Write
				want string
			}{"Where numbered from 1", fence.Write{Set: "status = $1", SetArgs: []any{"SENT"}, Where: "status = $1", WhereArgs: []any{"PENDING"}}, "its arguments are $2..$2"},
			struct {
				name string
				w    fence.Write
				want string
			}{"dollar quote", fence.Write{Set: "note = $$x$$"}, "dollar-quoted"})
	default:
		cases = append(cases, struct {
			name string
			w    fence.Write
			want string
		}{"$1 with " + e.d.String(), fence.Write{Set: "status = $1", SetArgs: []any{"SENT"}}, "placeholders are ?"})
	}
	if e.d == fence.MySQL {
		cases = append(cases, struct {
			name string
			w    fence.Write
			want string
		}{"# comment", fence.Write{Set: "status = 'SENT' # x"}, "comment"})
	}
	if e.d == fence.SQLite {
		cases = append(cases,
			struct {
				name string
				w    fence.Write
				want string
			}{"comment hidden behind a [quote]", fence.Write{Set: "status = 'SENT'", Where: "[x'] = 1 -- ']"}, "comment"},
			struct {
				name string
				w    fence.Write
				want string
			}{"numbered placeholder", fence.Write{Set: "status = ?1", SetArgs: []any{"SENT"}}, "numbered"},
			struct {
				name string
				w    fence.Write
				want string
			}{"named parameter", fence.Write{Set: "status = :s", SetArgs: []any{"SENT"}}, "named parameter"})
	}
	for _, c := range cases {
		for _, id := range []string{"inv_72", "inv_73"} {
			r, err := g.Update(ctx, nil, id, stale, c.w)
			if !errors.Is(err, fence.ErrInvalidWrite) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: stale write %+v, err %v; want ErrInvalidWrite mentioning %q", c.name, r, err, c.want)
			}
			if _, err := g.Update(ctx, nil, id, cur, c.w); !errors.Is(err, fence.ErrInvalidWrite) {
				t.Errorf("%s: current holder's write: err %v, want ErrInvalidWrite", c.name, err)
			}
		}
		unchanged(c.name)
	}

	// What a fragment may contain: literals holding comment markers,
	// semicolons and brackets, doubled quotes, several lines, sub-queries.
	literal := "a -- b; /* c */ (d) 'e' #f"
	w := fence.Write{
		Set:       "note = 'a -- b; /* c */ (d) ''e'' #f',\n  status = " + p1,
		SetArgs:   []any{"SENT"},
		Where:     "status IN (SELECT 'PENDING')\n  AND note IS NULL",
		WhereArgs: nil,
	}
	if r, err := g.Update(ctx, nil, "inv_72", cur, w); err != nil || !r.Applied() {
		t.Fatalf("well-formed fragments: %+v %v", r, err)
	}
	if got := e.row(t, table, "inv_72"); got.note.String != literal || got.status != "SENT" {
		t.Fatalf("row after well-formed write: %+v, want note %q", got, literal)
	}
	if got := e.row(t, table, "inv_73"); got != before["inv_73"] {
		t.Fatalf("the write to inv_72 changed inv_73: %+v", got)
	}
}

// testWrongKey (issue 16, item 2): fences are only comparable within one
// lease key, so a row records the key its fence belongs to and refuses a
// token of another key. On the old code a token for "batch:all" with fence
// 900 was applied to the row of invoice:inv_72 (at 5), locking its real
// holder (fence 6) out for ever.
func testWrongKey(t *testing.T, e sqlEnv) {
	ctx := context.Background()
	table := e.jobsTable(t, "inv_72", "inv_73", "inv_74")
	g := e.guard(t, table, nil)
	holder := fence.Token{Key: "invoice:inv_72", Fence: 5, Owner: "owner-a"}
	if r, err := g.Claim(ctx, nil, "inv_72", holder); err != nil || !r.Applied() {
		t.Fatalf("claim by the key's holder: %+v %v", r, err)
	}
	before := e.row(t, table, "inv_72")
	for _, other := range []fence.Token{
		{Key: "batch:all", Fence: 900, Owner: "owner-z"},
		{Key: "INVOICE:inv_72", Fence: 900, Owner: "owner-z"}, // keys compare byte for byte
		{Key: "invoice:inv_72 x", Fence: 900, Owner: "owner-z"},
	} {
		for _, op := range []string{"claim", "update"} {
			var r fence.Result
			var err error
			if op == "claim" {
				r, err = g.Claim(ctx, nil, "inv_72", other)
			} else {
				r, err = e.note(ctx, g, nil, "inv_72", other, "wrong key")
			}
			if !errors.Is(err, fence.ErrWrongKey) || !strings.Contains(err.Error(), `"invoice:inv_72"`) || !strings.Contains(err.Error(), other.Key) {
				t.Errorf("%s with a token of %q: %+v, %v; want ErrWrongKey naming both keys", op, other.Key, r, err)
			}
			if got := e.row(t, table, "inv_72"); got != before {
				t.Fatalf("%s with a token of %q changed the row: %+v -> %+v", op, other.Key, before, got)
			}
		}
	}
	// The key's real next holder is not locked out.
	next := fence.Token{Key: "invoice:inv_72", Fence: 6, Owner: "owner-b"}
	if r, err := e.note(ctx, g, nil, "inv_72", next, "next holder"); err != nil || !r.Applied() {
		t.Fatalf("next holder of the key: %+v %v", r, err)
	}
	// A token without a valid key is refused before anything is sent.
	for _, bad := range []string{"", " lead", strings.Repeat("k", limits.MaxKeyLen+1)} {
		if _, err := g.Claim(ctx, nil, "inv_73", fence.Token{Key: bad, Fence: 1, Owner: "o"}); !errors.Is(err, fence.ErrInvalidToken) {
			t.Errorf("token with key %q: %v, want ErrInvalidToken", bad, err)
		}
	}

	// Table.LeaseKey fixes the key before the first write: a wrong token
	// cannot even bind an unwritten row.
	bound, err := fence.NewSQL(e.db, e.d, fence.Table{Name: table, Key: "job_id",
		LeaseKey: func(id any) string { return fmt.Sprint("invoice:", id) }}, nil)
	if err != nil {
		t.Fatal(err)
	}
	unbound := e.row(t, table, "inv_73")
	if _, err := bound.Claim(ctx, nil, "inv_73", fence.Token{Key: "batch:all", Fence: 900, Owner: "owner-z"}); !errors.Is(err, fence.ErrWrongKey) {
		t.Fatalf("Table.LeaseKey: first write with a token of another key: %v, want ErrWrongKey", err)
	}
	if got := e.row(t, table, "inv_73"); got != unbound {
		t.Fatalf("refused first write changed the row: %+v -> %+v", unbound, got)
	}
	if r, err := bound.Claim(ctx, nil, "inv_73", fence.Token{Key: "invoice:inv_73", Fence: 1, Owner: "owner-a"}); err != nil || !r.Applied() {
		t.Fatalf("Table.LeaseKey: claim by the right key: %+v %v", r, err)
	}
	var recorded string
	if err := e.db.QueryRow(fmt.Sprintf("SELECT fence_key FROM %s WHERE job_id = %s", table, e.ph(1)), "inv_73").Scan(&recorded); err != nil || recorded != "invoice:inv_73" {
		t.Fatalf("recorded lease key %q, %v", recorded, err)
	}
	empty, err := fence.NewSQL(e.db, e.d, fence.Table{Name: table, Key: "job_id", LeaseKey: func(any) string { return "" }}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := empty.Claim(ctx, nil, "inv_74", fence.Token{Key: "invoice:inv_74", Fence: 1, Owner: "o"}); err == nil || !strings.Contains(err.Error(), "empty lease key") {
		t.Fatalf("Table.LeaseKey returning \"\": %v", err)
	}
}

// testShape (issue 16, item 5; issue 9, item 7): the shape check verifies
// the column types and that the key is unique, and a guard refuses to write
// to a table that fails it. On the old code Check passed a text fence
// column (fences 1, 2, 10 compared as text) and a key without a unique
// constraint (a guarded write changed every row with that key).
func testShape(t *testing.T, e sqlEnv) {
	ctx := context.Background()

	// A fence column of a text type.
	textFence := uniqueName("text_fence")
	e.exec(t, fmt.Sprintf("CREATE TABLE %s (job_id VARCHAR(64) PRIMARY KEY, note VARCHAR(64), fence VARCHAR(20) NOT NULL DEFAULT '0', %s)", textFence, e.identityCols()))
	e.exec(t, fmt.Sprintf("INSERT INTO %s (job_id, note, fence) VALUES ('j', 'orig', '2')", textFence))
	g, err := fence.NewSQL(e.db, e.d, fence.Table{Name: textFence, Key: "job_id"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{"Check": g.Check(ctx), "EnsureColumns": g.EnsureColumns(ctx)} {
		if !errors.Is(err, fence.ErrSchema) || !strings.Contains(err.Error(), "fence column fence has type") {
			t.Errorf("%s with a text fence column: %v, want ErrSchema naming its type", name, err)
		}
	}
	if r, err := g.Update(ctx, nil, "j", tok(10, "owner-a"), fence.Write{Set: "note = 'new'"}); !errors.Is(err, fence.ErrSchema) {
		t.Errorf("write over a text fence column: %+v %v, want ErrSchema", r, err)
	}
	var note, f string
	if err := e.db.QueryRow(fmt.Sprintf("SELECT note, fence FROM %s WHERE job_id = 'j'", textFence)).Scan(&note, &f); err != nil || note != "orig" || f != "2" {
		t.Errorf("row with a text fence changed: %q %q %v", note, f, err)
	}

	// A key without a unique constraint, the fence column named last_fence.
	noKey := uniqueName("no_key")
	e.exec(t, fmt.Sprintf("CREATE TABLE %s (job_id VARCHAR(64) NOT NULL, note VARCHAR(64), last_fence BIGINT NOT NULL DEFAULT 0, %s)", noKey, e.identityCols()))
	e.exec(t, fmt.Sprintf("INSERT INTO %s (job_id, note) VALUES ('dup', 'one'), ('dup', 'two')", noKey))
	g, err = fence.NewSQL(e.db, e.d, fence.Table{Name: noKey, Key: "job_id", FenceColumn: "last_fence"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{"Check": g.Check(ctx), "EnsureColumns": g.EnsureColumns(ctx)} {
		if !errors.Is(err, fence.ErrSchema) || !strings.Contains(err.Error(), "key column job_id is not unique") {
			t.Errorf("%s with a key that is not unique: %v, want ErrSchema saying so", name, err)
		}
	}
	for _, op := range []string{"claim", "update"} {
		var err error
		if op == "claim" {
			_, err = g.Claim(ctx, nil, "dup", tok(7, "owner-a"))
		} else {
			_, err = g.Update(ctx, nil, "dup", tok(7, "owner-a"), fence.Write{Set: "note = 'both'"})
		}
		if !errors.Is(err, fence.ErrSchema) || !strings.Contains(err.Error(), "not unique") {
			t.Errorf("%s on a key that is not unique: %v, want ErrSchema", op, err)
		}
	}
	var changed int
	if err := e.db.QueryRow(fmt.Sprintf("SELECT COUNT(*) FROM %s WHERE note NOT IN ('one', 'two') OR last_fence <> 0", noKey)).Scan(&changed); err != nil || changed != 0 {
		t.Errorf("rows with a duplicated key changed: %d %v", changed, err)
	}

	// Unique constraints that do not make the key alone unique are refused;
	// a unique index on it is enough.
	for _, c := range []struct {
		name, index string
		ok          bool
	}{
		{"unique over two columns", "CREATE UNIQUE INDEX %s_u ON %s (job_id, note)", false},
		{"partial unique index", "CREATE UNIQUE INDEX %s_u ON %s (job_id) WHERE note IS NOT NULL", false},
		{"plain index", "CREATE INDEX %s_u ON %s (job_id)", false},
		{"unique index", "CREATE UNIQUE INDEX %s_u ON %s (job_id)", true},
	} {
		if c.name == "partial unique index" && e.d == fence.MySQL {
			continue // MySQL has no partial indexes
		}
		name := uniqueName("idx")
		e.exec(t, fmt.Sprintf("CREATE TABLE %s (job_id VARCHAR(64) NOT NULL, note VARCHAR(64), fence BIGINT NOT NULL DEFAULT 0, %s)", name, e.identityCols()))
		e.exec(t, fmt.Sprintf(c.index, name, name))
		g, err := fence.NewSQL(e.db, e.d, fence.Table{Name: name, Key: "job_id"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		err = g.Check(ctx)
		if c.ok != (err == nil) || (err != nil && !strings.Contains(err.Error(), "not unique")) {
			t.Errorf("%s: Check = %v, want ok=%v", c.name, err, c.ok)
		}
	}

	// Identity columns that are not text.
	intOwner := uniqueName("int_owner")
	e.exec(t, fmt.Sprintf("CREATE TABLE %s (job_id VARCHAR(64) PRIMARY KEY, fence BIGINT NOT NULL DEFAULT 0, fence_owner INTEGER, fence_key INTEGER)", intOwner))
	g, err = fence.NewSQL(e.db, e.d, fence.Table{Name: intOwner, Key: "job_id"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Check(ctx); !errors.Is(err, fence.ErrSchema) || !strings.Contains(err.Error(), "column fence_owner has type") || !strings.Contains(err.Error(), "column fence_key has type") {
		t.Errorf("Check with integer owner and key columns: %v", err)
	}
}

// testUncheckedGuard: a guard on which neither Check nor EnsureColumns was
// called (a worker process whose table a migration created) checks the
// table on its first write, on the connection it writes with, also in the
// caller's transaction, and refuses a table that fails the check.
func testUncheckedGuard(t *testing.T, e sqlEnv) {
	ctx := context.Background()
	table := e.jobsTable(t, "inv_72")
	e.guard(t, table, nil) // the migration: adds the columns
	g, err := fence.NewSQL(e.db, e.d, fence.Table{Name: table, Key: "job_id"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = inTx(t, e.db, func(tx *sql.Tx) error {
		r, err := g.Claim(ctx, tx, "inv_72", tok(3, "owner-a"))
		if err == nil && !r.Applied() {
			err = fmt.Errorf("not applied: %+v", r)
		}
		return err
	})
	if err != nil {
		t.Fatalf("first write, in a caller's transaction: %v", err)
	}
	if got := e.row(t, table, "inv_72"); got.fence != 3 {
		t.Fatalf("row after the first write: %+v", got)
	}

	// A table whose key is not unique, never checked: the first write in a
	// caller's transaction is refused before anything is changed.
	noKey := uniqueName("no_key_tx")
	e.exec(t, fmt.Sprintf("CREATE TABLE %s (job_id VARCHAR(64) NOT NULL, note VARCHAR(64), fence BIGINT NOT NULL DEFAULT 0, %s)", noKey, e.identityCols()))
	e.exec(t, fmt.Sprintf("INSERT INTO %s (job_id, note) VALUES ('dup', 'one'), ('dup', 'two')", noKey))
	bad, err := fence.NewSQL(e.db, e.d, fence.Table{Name: noKey, Key: "job_id"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = inTx(t, e.db, func(tx *sql.Tx) error {
		_, err := bad.Update(ctx, tx, "dup", tok(3, "owner-a"), fence.Write{Set: "note = 'both'"})
		return err
	})
	if !errors.Is(err, fence.ErrSchema) || !strings.Contains(err.Error(), "not unique") {
		t.Fatalf("first write to a table with a key that is not unique, in a caller's transaction: %v", err)
	}
	var changed int
	if err := e.db.QueryRow(fmt.Sprintf("SELECT COUNT(*) FROM %s WHERE note NOT IN ('one', 'two') OR fence <> 0", noKey)).Scan(&changed); err != nil || changed != 0 {
		t.Fatalf("rows changed: %d %v", changed, err)
	}
}

// testClaimAndRead: the claim transaction of the safe sequence claims,
// reads and commits; a Stale claim does not run read; a failing or
// overlong read leaves nothing committed.
func testClaimAndRead(t *testing.T, e sqlEnv) {
	ctx := context.Background()
	table := e.jobsTable(t, "inv_72")
	g := e.guard(t, table, nil)
	selectStatus := fmt.Sprintf("SELECT status FROM %s WHERE job_id = %s", table, e.ph(1))
	a, b := tok(41, "owner-a"), tok(42, "owner-b")

	var status string
	r, err := g.ClaimAndRead(ctx, "inv_72", a, func(ctx context.Context, tx *sql.Tx) error {
		return tx.QueryRowContext(ctx, selectStatus, "inv_72").Scan(&status)
	})
	if err != nil || !r.Applied() || status != "PENDING" {
		t.Fatalf("claim and read: %+v %v, status %q", r, err, status)
	}
	if got := e.row(t, table, "inv_72"); got.fence != 41 || got.owner != "owner-a" {
		t.Fatalf("claim not committed: %+v", got)
	}

	boom := errors.New("boom")
	if _, err := g.ClaimAndRead(ctx, "inv_72", b, func(context.Context, *sql.Tx) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("failing read: %v, want its error", err)
	}
	if got := e.row(t, table, "inv_72"); got.fence != 41 {
		t.Fatalf("a failing read left the claim committed: %+v", got)
	}

	short, err := fence.NewSQL(e.db, e.d, fence.Table{Name: table, Key: "job_id"}, &fence.SQLOptions{Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	_, err = short.ClaimAndRead(ctx, "inv_72", b, func(ctx context.Context, tx *sql.Tx) error {
		<-ctx.Done() // a read that outlasts the timeout
		return ctx.Err()
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("read past the timeout: %v", err)
	}
	if got := e.row(t, table, "inv_72"); got.fence != 41 {
		t.Fatalf("an overlong read left the claim committed: %+v", got)
	}

	if r, err := g.ClaimAndRead(ctx, "inv_72", b, nil); err != nil || !r.Applied() {
		t.Fatalf("claim without read: %+v %v", r, err)
	}
	called := false
	r, err = g.ClaimAndRead(ctx, "inv_72", a, func(context.Context, *sql.Tx) error { called = true; return nil })
	if err != nil || r.Outcome != fence.Stale || r.Current != 42 || called {
		t.Fatalf("stale claim: %+v %v, read called %v", r, err, called)
	}
	if _, err := g.ClaimAndRead(ctx, "inv_404", b, nil); !errors.Is(err, fence.ErrNoRow) {
		t.Fatalf("missing row: %v", err)
	}
	if _, err := g.ClaimAndRead(ctx, "inv_72", fence.Token{Key: "batch:all", Fence: 99, Owner: "z"}, func(context.Context, *sql.Tx) error { called = true; return nil }); !errors.Is(err, fence.ErrWrongKey) || called {
		t.Fatalf("wrong key: %v (read called %v)", err, called)
	}
	if _, err := fence.NewSQL(e.db, e.d, fence.Table{Name: table, Key: "job_id"}, &fence.SQLOptions{Timeout: -time.Second}); err == nil {
		t.Fatal("negative timeout accepted")
	}
}

// testRestartHint (issue 16, item 13, guard side): a stale refusal whose
// resource fence is far above the token's says that the lease store's
// counter has probably restarted; a near one does not.
func testRestartHint(t *testing.T, e sqlEnv) {
	ctx := context.Background()
	table := e.jobsTable(t, "inv_72")
	g := e.guard(t, table, nil)
	if r, err := g.Claim(ctx, nil, "inv_72", tok(44, "owner-old")); err != nil || !r.Applied() {
		t.Fatalf("claim at 44: %+v %v", r, err)
	}
	r, err := g.Claim(ctx, nil, "inv_72", tok(2, "owner-new"))
	if err != nil || r.Outcome != fence.Stale {
		t.Fatalf("claim at 2: %+v %v", r, err)
	}
	if msg := r.Err().Error(); !errors.Is(r.Err(), fenced.ErrStaleFence) || !strings.Contains(msg, "counter has probably restarted") || !strings.Contains(msg, "above 44") {
		t.Fatalf("far-off stale error: %v", msg)
	}
	r, err = g.Claim(ctx, nil, "inv_72", tok(40, "owner-new"))
	if err != nil || r.Outcome != fence.Stale || strings.Contains(r.Err().Error(), "restarted") {
		t.Fatalf("near stale refusal: %+v %v %v", r, err, r.Err())
	}
}

// refuseTokens is a Checker that refuses every token.
type refuseTokens struct{}

var errNotTrusted = errors.New("token not trusted")

func (refuseTokens) Check(context.Context, fence.Token) error { return errNotTrusted }

// testChecker: a guard with SQLOptions.Check sends nothing for a token its
// Checker refuses (for example an unsigned or forged one).
func testChecker(t *testing.T, e sqlEnv) {
	ctx := context.Background()
	table := e.jobsTable(t, "inv_72")
	e.guard(t, table, nil)
	before := e.row(t, table, "inv_72")
	g, err := fence.NewSQL(e.db, e.d, fence.Table{Name: table, Key: "job_id"}, &fence.SQLOptions{Check: refuseTokens{}})
	if err != nil {
		t.Fatal(err)
	}
	forged := fence.Token{Key: "invoice:inv_72", Fence: fence.MaxFence, Owner: "forger"}
	if _, err := g.Claim(ctx, nil, "inv_72", forged); !errors.Is(err, errNotTrusted) {
		t.Errorf("claim with a refused token: %v", err)
	}
	if _, err := e.note(ctx, g, nil, "inv_72", forged, "forged"); !errors.Is(err, errNotTrusted) {
		t.Errorf("update with a refused token: %v", err)
	}
	if _, err := g.ClaimAndRead(ctx, "inv_72", forged, nil); !errors.Is(err, errNotTrusted) {
		t.Errorf("claim and read with a refused token: %v", err)
	}
	if got := e.row(t, table, "inv_72"); got != before {
		t.Fatalf("refused tokens changed the row: %+v -> %+v", before, got)
	}
}
