package pgxfence_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fence"
	"github.com/fenced-dev/fenced/fence/pgxfence"
	"github.com/fenced-dev/fenced/internal/testenv"
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
	g, err := fence.NewSQL(db, fence.Postgres, fence.Table{Name: "jobs", Key: "id"}, &fence.SQLOptions{Hooks: fenced.Hooks{StaleWrite: func(fenced.StaleWriteEvent) { stale++ }}})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.EnsureColumns(ctx); err != nil {
		t.Fatal(err)
	}
	a := fence.Token{Key: "job:j1", Fence: 4, Owner: "owner-a"}
	b := fence.Token{Key: "job:j1", Fence: 5, Owner: "owner-b"}

	// The new holder claims inside a native pgx transaction.
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
	if stale != 1 {
		t.Fatalf("%d stale reports, want 1", stale)
	}
}
