package pgxfence_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fence"
	"github.com/fenced-dev/fenced/fence/pgxfence"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

func TestNativePgx(t *testing.T) {
	ctx := context.Background()
	pg := testenv.StartPostgres(t)
	pool, err := pgxpool.New(ctx, pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE jobs (id text PRIMARY KEY, status text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	pool.Exec(ctx, `INSERT INTO jobs VALUES ('j1', 'PENDING')`)
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	var stale int
	g, err := fence.NewSQL(db, fence.Postgres, fence.Table{Name: "jobs", Key: "id"}, &fence.SQLOptions{Hook: func(e fenced.Event) {
		if e.Kind == fenced.EventStaleWrite {
			stale++
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.EnsureColumns(ctx); err != nil {
		t.Fatal(err)
	}
	a := fence.Token{Key: "job:j1", Fence: 4, Owner: "owner-a"}
	b := fence.Token{Key: "job:j1", Fence: 5, Owner: "owner-b"}

	// The new holder claims and reads inside a native pgx transaction that
	// the guard commits.
	var status string
	r, err := pgxfence.ClaimAndRead(ctx, g, pool, "j1", b, func(ctx context.Context, tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT status FROM jobs WHERE id = $1`, "j1").Scan(&status)
	})
	if err != nil || !r.Applied() || status != "PENDING" {
		t.Fatalf("claim and read: %+v %v, status %q", r, err, status)
	}
	if f, _, err := g.CurrentConn(ctx, pgxfence.Conn(pool), "j1"); err != nil || f != 5 {
		t.Fatalf("claim not committed: fence %d %v", f, err)
	}
	called := false
	if r, err := pgxfence.ClaimAndRead(ctx, g, pool, "j1", a, func(context.Context, pgx.Tx) error { called = true; return nil }); err != nil || r.Outcome != fence.Stale || called {
		t.Fatalf("stale claim and read: %+v %v (read called %v)", r, err, called)
	}
	if _, err := pgxfence.ClaimAndRead(ctx, g, pool, "j1", fence.Token{Key: "job:other", Fence: 9, Owner: "o"}, nil); !errors.Is(err, fence.ErrWrongKey) {
		t.Fatalf("token of another key: %v", err)
	}
	// Claiming in the caller's own pgx transaction works too.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := g.ClaimConn(ctx, pgxfence.Conn(tx), "j1", b); err != nil || !r.Applied() {
		t.Fatalf("claim: %+v %v", r, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	send := fence.Write{Set: "status = $1", SetArgs: []any{"SENT"}, Where: "status = $2", WhereArgs: []any{"PENDING"}}
	if r, err := g.UpdateConn(ctx, pgxfence.Conn(pool), "j1", a, send); err != nil || r.Outcome != fence.Stale || r.Current != 5 {
		t.Fatalf("stale send: %+v %v", r, err)
	}
	if r, err := g.UpdateConn(ctx, pgxfence.Conn(pool), "j1", b, send); err != nil || !r.Applied() {
		t.Fatalf("send: %+v %v", r, err)
	}
	if r, err := g.UpdateConn(ctx, pgxfence.Conn(pool), "j1", b, send); err != nil || r.Outcome != fence.PreconditionFailed {
		t.Fatalf("second send: %+v %v", r, err)
	}
	if _, err := g.ClaimConn(ctx, pgxfence.Conn(pool), "nope", b); !errors.Is(err, fence.ErrNoRow) {
		t.Fatalf("missing row: %v", err)
	}
	if f, o, err := g.CurrentConn(ctx, pgxfence.Conn(pool), "j1"); err != nil || f != 5 || o != "owner-b" {
		t.Fatalf("current %d %q %v", f, o, err)
	}
	if stale != 2 {
		t.Fatalf("%d stale reports, want 2", stale)
	}
}
