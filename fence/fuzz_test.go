package fence_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/fenced-dev/fenced"
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
	g, err := fence.NewSQL(e.db, e.d, fence.Table{Name: table, Key: "job_id"}, &fence.SQLOptions{Hooks: fenced.Hooks{}})
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
