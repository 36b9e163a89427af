package fence_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/fenced-dev/fenced/fence"
)

// FuzzSQLGuardOrder drives the SQLite guard with any sequence of writes
// decoded from the fuzzer's bytes (two bytes per write: fence 1..16, owner
// 0..3, claim or update) and checks that the accepted sequence never goes
// back in fence order, never accepts a second owner at one fence, and that
// every refusal names the fence the row holds. Its seed corpus runs with go
// test; go test -fuzz FuzzSQLGuardOrder explores further.
func FuzzSQLGuardOrder(f *testing.F) {
	for _, seed := range [][]byte{
		{},
		{5, 0, 4, 1, 5, 2},                 // older after newer
		{3, 0, 3, 1, 3, 0},                 // same fence, other owner
		{1, 0, 16, 3, 15, 2, 16, 3, 16, 0}, // claim-heavy
		[]byte("the quick brown fox"),
	} {
		f.Add(seed)
	}
	e := sqlEnv{db: openSQLite(f), d: fence.SQLite}
	table := "fuzz_jobs"
	if _, err := e.db.Exec(`CREATE TABLE fuzz_jobs (job_id TEXT PRIMARY KEY, status TEXT NOT NULL, sends INTEGER NOT NULL DEFAULT 0, note TEXT)`); err != nil {
		f.Fatal(err)
	}
	g, err := fence.NewSQL(e.db, e.d, fence.Table{Name: table, Key: "job_id"}, &fence.SQLOptions{})
	if err == nil {
		err = g.EnsureColumns(context.Background())
	}
	if err != nil {
		f.Fatal(err)
	}
	var n atomic.Int64
	f.Fuzz(func(t *testing.T, ops []byte) {
		ctx := context.Background()
		id := fmt.Sprintf("fz_%d", n.Add(1))
		if _, err := e.db.Exec(fmt.Sprintf("INSERT INTO %s (job_id, status) VALUES (?, 'PENDING')", table), id); err != nil {
			t.Fatal(err)
		}
		var rowF uint64
		var rowO string
		for i := 0; i+1 < len(ops) && i < 64; i += 2 {
			tk := fence.Token{Key: id, Fence: uint64(ops[i]%16) + 1, Owner: fmt.Sprint("o", ops[i+1]%4)}
			var r fence.Result
			var err error
			if ops[i+1]&4 != 0 {
				r, err = g.Claim(ctx, nil, id, tk)
			} else {
				r, err = e.note(ctx, g, nil, id, tk, fmt.Sprint(i))
			}
			if err != nil {
				t.Fatal(err)
			}
			admitted := tk.Fence > rowF || (tk.Fence == rowF && tk.Owner == rowO)
			switch {
			case admitted && r.Applied():
				rowF, rowO = tk.Fence, tk.Owner
			case !admitted && r.Outcome == fence.Stale && r.Current == rowF && r.SameFenceOtherOwner == (tk.Fence == rowF):
			default:
				t.Fatalf("write %v on row (%d,%s): %+v", tk, rowF, rowO, r)
			}
		}
		if f, o, err := g.Current(ctx, nil, id); err != nil || f != rowF || (rowF != 0 && o != rowO) {
			t.Fatalf("row holds (%d,%s), model (%d,%s), %v", f, o, rowF, rowO, err)
		}
	})
}

// FuzzSQLFragment feeds arbitrary text as a write's Set or Where fragment
// to the SQLite guard and checks that no fragment can switch the guard
// off: a stale token never applies, the row's fence never moves, and the
// other row is never touched, whether the guard refuses the fragment, the
// database refuses the statement, or it runs. Its seed corpus (the tricks
// of issue 16 among them) runs with go test.
func FuzzSQLFragment(f *testing.F) {
	for _, seed := range []string{
		"status = ? -- mark sent",
		"1=1) OR (1=1",
		"1=1 /* x */",
		"[x'] = 1 -- ']",
		"'a' = 'a'; UPDATE fz SET note = 'x'",
		"note = 'it''s' OR 1=1",
		"`a` = 1) OR (1",
		"\"x\" = 1 --",
		"status IN (SELECT 'PENDING')",
		"1=1\n-- \n",
		"x = ?1",
		"$a = 1",
	} {
		f.Add(seed, false)
		f.Add(seed, true)
	}
	db := openSQLite(f)
	if _, err := db.Exec(`CREATE TABLE fz (job_id TEXT PRIMARY KEY, status TEXT NOT NULL, note TEXT)`); err != nil {
		f.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO fz (job_id, status) VALUES ('a', 'PENDING'), ('b', 'PENDING')`); err != nil {
		f.Fatal(err)
	}
	g, err := fence.NewSQL(db, fence.SQLite, fence.Table{Name: "fz", Key: "job_id"}, nil)
	if err == nil {
		err = g.EnsureColumns(context.Background())
	}
	if err != nil {
		f.Fatal(err)
	}
	ctx := context.Background()
	cur := fence.Token{Key: "job:a", Fence: 42, Owner: "owner-b"}
	stale := fence.Token{Key: "job:a", Fence: 41, Owner: "owner-a"}
	if r, err := g.Claim(ctx, nil, "a", cur); err != nil || !r.Applied() {
		f.Fatalf("claim: %+v %v", r, err)
	}
	snapshot := func() string {
		var s string
		if err := db.QueryRow(`SELECT group_concat(job_id || ':' || status || ':' || COALESCE(note, '-') || ':' || fence || ':' || fence_owner || ':' || fence_key, ' ') FROM fz`).Scan(&s); err != nil {
			f.Fatal(err)
		}
		return s
	}
	before := snapshot()
	f.Fuzz(func(t *testing.T, fragment string, asSet bool) {
		w := fence.Write{Set: "note = 'x'", Where: fragment}
		if asSet {
			w = fence.Write{Set: fragment}
		}
		// One argument per ? outside the guard's view, so that counting
		// mistakes cannot hide behind an argument error.
		args := []any{}
		for i := 0; i < strings.Count(fragment, "?") && i < 8; i++ {
			args = append(args, "PENDING")
		}
		if asSet {
			w.SetArgs = args
		} else {
			w.WhereArgs = args
		}
		r, err := g.Update(ctx, nil, "a", stale, w)
		if err == nil && r.Applied() {
			t.Fatalf("fragment %q (Set %v): a stale token was applied", fragment, asSet)
		}
		if after := snapshot(); after != before {
			t.Fatalf("fragment %q (Set %v) changed the table:\n%s\n->\n%s", fragment, asSet, before, after)
		}
	})
}
