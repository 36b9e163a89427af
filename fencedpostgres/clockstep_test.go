package fencedpostgres_test

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fence"
	"github.com/fenced-dev/fenced/fence/pgxfence"
	"github.com/fenced-dev/fenced/fencedpostgres"
	"github.com/fenced-dev/fenced/internal/core/rootaccess"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// TestClockStepEndsGrantEarly reproduces the hazard PostgreSQL declares
// with Capabilities.ClockStepSafe == false. A holds a lease; the database's
// wall clock steps forward by more than the TTL, so now() in the grant
// statement finds A's row expired while A's local validity, on A's
// monotonic clock, has almost the whole TTL left. B is granted the key
// with a higher fence: two holders overlap. The guarded table still
// refuses A's write once B has claimed the row.
func TestClockStepEndsGrantEarly(t *testing.T) {
	ctx := ctxT(t)
	clock := testenv.NewWallClock(t)
	srv := testenv.StartPostgresOnClock(t, clock)
	openClient := func() *fenced.Client {
		d, err := fencedpostgres.Open(ctx, srv.URL())
		if err != nil {
			t.Fatal(err)
		}
		c := fenced.NewClient(d, nil)
		t.Cleanup(func() { c.Close() })
		return c
	}
	a, b := openClient(), openClient()
	if g := a.Capabilities(); g.ClockStepSafe {
		t.Fatalf("PostgreSQL declares ClockStepSafe, but now() is its wall clock: %+v", g)
	}

	// No automatic renewal: A keeps trusting its first grant until local
	// validity runs out, as a holder between two renewals does. The TTL is
	// long only so that a loaded machine cannot end A's local validity
	// before B's grant; nothing waits for it.
	opts := &fenced.LeaseOptions{TTL: 20 * time.Second, ManualRenew: true}
	la, err := a.TryAcquire(ctx, "ledger", opts)
	if err != nil {
		t.Fatal(err)
	}
	clock.Step(2 * opts.TTL)
	lb, err := b.TryAcquire(ctx, "ledger", opts)
	if err != nil {
		t.Fatalf("B after a %v forward step of the database's clock: %v (now() did not follow the wall clock?)", 2*opts.TTL, err)
	}
	if overlap := time.Now(); la.Err() != nil || !overlap.Before(rootaccess.ValidUntil(la)) {
		t.Fatalf("A's local validity ended (%v, valid until %v) before B's grant: no overlap shown", la.Err(), rootaccess.ValidUntil(la))
	}
	t.Logf("two holders: A fence %d (locally valid for %v more), B fence %d", la.Fence(), time.Until(rootaccess.ValidUntil(la)).Round(time.Millisecond), lb.Fence())
	if lb.Fence() <= la.Fence() {
		t.Fatalf("B's fence %d is not above A's %d", lb.Fence(), la.Fence())
	}

	pool, err := pgxpool.New(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE accounts (id text PRIMARY KEY, balance int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO accounts VALUES ('acct-1', 0)`); err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	guard, err := fence.NewSQL(db, fence.Postgres, fence.Table{Name: "accounts", Key: "id"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := guard.EnsureColumns(ctx); err != nil {
		t.Fatal(err)
	}
	conn := pgxfence.Conn(pool)
	if r, err := guard.ClaimConn(ctx, conn, "acct-1", fence.From(lb)); err != nil || !r.Applied() {
		t.Fatalf("B's claim: %+v, %v", r, err)
	}
	write := func(l *fenced.Lease, balance int) fence.Result {
		t.Helper()
		r, err := guard.UpdateConn(ctx, conn, "acct-1", fence.From(l), fence.Write{Set: "balance = $1", SetArgs: []any{balance}})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := write(la, 100); r.Outcome != fence.Stale || !errors.Is(r.Err(), fenced.ErrStaleFence) || r.Current != lb.Fence() {
		t.Fatalf("A's write after B's claim: %+v (%v), want refused as stale with B's fence %d", r, r.Err(), lb.Fence())
	}
	if r := write(lb, 90); !r.Applied() {
		t.Fatalf("B's write: %+v", r)
	}
	var balance int
	if err := pool.QueryRow(ctx, `SELECT balance FROM accounts WHERE id = 'acct-1'`).Scan(&balance); err != nil || balance != 90 {
		t.Fatalf("balance %d (%v), want B's 90", balance, err)
	}
	// A learns of the loss from the authority at its next renewal.
	if err := la.Renew(ctx); !errors.Is(err, fenced.ErrNotHeld) {
		t.Fatalf("A's renewal after B's grant: %v, want ErrNotHeld", err)
	}
	if err := lb.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
