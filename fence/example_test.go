package fence_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fence"
	"github.com/fenced-dev/fenced/mem"
)

// A guarded row: claim first, then write; an older holder is refused with
// the newer fence, and a repeated transition is told apart from staleness.
func ExampleSQL() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "example-")
	defer os.RemoveAll(dir)
	db, _ := sql.Open("sqlite", "file:"+filepath.Join(dir, "jobs.db"))
	defer db.Close()
	db.Exec(`CREATE TABLE invoice_jobs (job_id TEXT PRIMARY KEY, status TEXT NOT NULL)`)
	db.Exec(`INSERT INTO invoice_jobs VALUES ('inv_72', 'PENDING')`)

	guard, err := fence.NewSQL(db, fence.SQLite, fence.Table{Name: "invoice_jobs", Key: "job_id"}, nil)
	if err != nil {
		panic(err)
	}
	if err := guard.EnsureColumns(ctx); err != nil { // adds fence and fence_owner
		panic(err)
	}
	old := fence.Token{Key: "invoice:inv_72", Fence: 41, Owner: "a1"}
	cur := fence.Token{Key: "invoice:inv_72", Fence: 42, Owner: "b2"}
	send := fence.Write{Set: "status = ?", SetArgs: []any{"SENT"}, Where: "status = ?", WhereArgs: []any{"PENDING"}}

	r, _ := guard.Claim(ctx, nil, "inv_72", cur)
	fmt.Println("claim by 42:", r.Outcome)
	r, _ = guard.Update(ctx, nil, "inv_72", old, send)
	fmt.Println("send by 41:", r.Outcome, r.Current)
	r, _ = guard.Update(ctx, nil, "inv_72", cur, send)
	fmt.Println("send by 42:", r.Outcome)
	r, _ = guard.Update(ctx, nil, "inv_72", cur, send)
	fmt.Println("send by 42 again:", r.Outcome)
	// Output:
	// claim by 42: applied
	// send by 41: stale 42
	// send by 42: applied
	// send by 42 again: precondition failed
}

// A service that checks fences over HTTP: the client's Transport sends the
// lease's token, the server's Middleware refuses a holder older than one it
// has already seen with 409 and the standard JSON body. The lease key each
// request needs comes from its route, never from the client.
func ExampleMiddleware() {
	ctx := context.Background()
	leases := fenced.NewClient(mem.NewStore(nil).Driver(), nil)
	defer leases.Close()

	var ledger []string
	mux := http.NewServeMux()
	mux.Handle("POST /ledger/{acct}", fence.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		ledger = append(ledger, string(b)) // serialized per key by the Store
	}), &fence.MiddlewareOptions{
		Key:   func(r *http.Request) (string, error) { return "ledger:" + r.PathValue("acct"), nil },
		Store: fence.NewMemoryStore(),
	}))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	client := &http.Client{Transport: &fence.Transport{}}
	post := func(l *fenced.Lease, acct, body string) {
		req, _ := http.NewRequestWithContext(fence.WithLease(ctx, l), "POST", srv.URL+"/ledger/"+acct, strings.NewReader(body))
		resp, err := client.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		if err := fence.ResponseError(resp); err != nil {
			fmt.Println(resp.StatusCode, err)
			return
		}
		resp.Body.Close()
		fmt.Println(resp.StatusCode)
	}

	a, _ := leases.TryAcquire(ctx, "ledger:acct1", nil)
	post(a, "acct1", "a")
	leases.Break(ctx, "ledger:acct1", "A is frozen", "ops") // A does not notice
	b, _ := leases.TryAcquire(ctx, "ledger:acct1", nil)
	defer b.Release(ctx)
	post(b, "acct1", "b")
	post(a, "acct1", "a-late")
	post(b, "acct2", "b-elsewhere") // a token for ledger:acct1 on ledger:acct2
	fmt.Println(ledger)
	// Output:
	// 200
	// 200
	// 409 fence: HTTP 409 fence_stale: stale fence: a newer holder exists: resource has fence 2
	// 403 fence: HTTP 403 fence_wrong_key: fence: token is for another lease key: token is for "ledger:acct1", resource is bound to "ledger:acct2"
	// [a b]
}
