package fencedpostgres_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/drivertest"
	"github.com/fenced-dev/fenced/fencedpostgres"
	"github.com/fenced-dev/fenced/internal/core/capability"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
	"github.com/fenced-dev/fenced/recipe/recipetest"
)

var (
	bouncerOnce sync.Once
	bouncer     *testenv.PgBouncer
)

// pooler returns a PgBouncer in transaction mode in front of the shared
// server, started once for the package.
func pooler(t *testing.T) *testenv.PgBouncer {
	bouncerOnce.Do(func() { bouncer = testenv.StartPgBouncer(mainTB, pg) })
	if bouncer == nil {
		t.Fatal("pgbouncer did not start")
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- pgbouncer output ---\n%s", bouncer.Output())
		}
	})
	return bouncer
}

// The whole contract holds through a transaction-mode pooler: no lease
// operation relies on session state. LISTEN cannot work there; the driver
// finds that out at startup, says so, and waiters poll. (This run is also
// the conformance run of the polling mode, notify=off.)
func TestConformanceThroughTransactionPooler(t *testing.T) {
	b := pooler(t)
	u := b.URL("pooled", "default_query_exec_mode=exec", "table=pooled_leases")
	d, err := fencedpostgres.Open(ctxT(t), u)
	if err != nil {
		t.Fatal(err)
	}
	g, notified := d.Capabilities(), capability.Of(d).Notifies()
	d.Close()
	if notified || !strings.Contains(g.Note, "LISTEN unavailable") {
		t.Fatalf("through a transaction pooler the driver declares %+v, notified waiters %v; want no notification and a note saying LISTEN is unavailable", g, notified)
	}
	t.Logf("declared through PgBouncer: %s", g.Note)
	h := drivertest.Harness{
		// Generous for a loaded CI machine: expiry tests sleep about this long.
		ShortTTL: time.Second,
		Open: func(t *testing.T) driver.Driver {
			d, err := fencedpostgres.Open(ctxT(t), u+"&notify=off")
			if err != nil {
				t.Fatal(err)
			}
			return d
		},
	}
	drivertest.RunConformanceTests(t, h)
	recipetest.RunConformanceTests(t, h)
}

// With a direct connection for LISTEN, notifications work while every
// lease operation goes through the pooler.
func TestPoolerWithDirectListenConnection(t *testing.T) {
	ctx := ctxT(t)
	b := pooler(t)
	cfg, err := pgxpool.ParseConfig(b.URL("pooled", "default_query_exec_mode=exec"))
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	direct, err := pgx.ParseConfig(pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	d, err := fencedpostgres.New(ctx, pool, &fencedpostgres.Options{Table: "pooled_leases", ListenConfig: direct})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if !capability.Of(d).Notifies() {
		t.Fatalf("with a direct LISTEN connection: no notification declared: %+v, %+v", d.Capabilities(), d.Capabilities())
	}
	key := "pooler:direct-listen"
	f, err := d.TryAcquire(ctx, key, "holder", 60e9)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := d.Subscribe(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if err := d.Release(ctx, driver.Grant{Key: key, Owner: "holder", Fence: f}); err != nil {
		t.Fatal(err)
	}
	if !signalled(sub.C(), 10e9) {
		t.Fatal("a release through the pooler did not reach the direct LISTEN connection")
	}
}

// Why WithAdvisoryLock offers only the transaction-scoped lock: behind a
// transaction pooler, two clients that share a server session both
// "acquire" a session-scoped advisory lock, while the transaction-scoped
// lock still excludes.
func TestSessionAdvisoryLockBreaksBehindPooler(t *testing.T) {
	ctx := ctxT(t)
	b := pooler(t)
	connect := func() *pgx.Conn {
		c, err := pgx.Connect(ctx, b.URL("single", "default_query_exec_mode=simple_protocol"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	x, y := connect(), connect()
	var gotX, gotY bool
	if err := x.QueryRow(ctx, "SELECT pg_try_advisory_lock(4242)").Scan(&gotX); err != nil {
		t.Fatal(err)
	}
	if err := y.QueryRow(ctx, "SELECT pg_try_advisory_lock(4242)").Scan(&gotY); err != nil {
		t.Fatal(err)
	}
	if !gotX || !gotY {
		t.Fatalf("session locks through the pooler: client X got %v, client Y got %v; expected both (the hazard this test documents)", gotX, gotY)
	}
	t.Log("behind a transaction pooler, two clients both hold the same session-scoped advisory lock")
	x.Exec(ctx, "SELECT pg_advisory_unlock_all()")

	// The transaction-scoped form excludes, pooler or not.
	pool, err := pgxpool.New(ctx, b.URL("pooled", "default_query_exec_mode=exec"))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	release := holdAdvisory(t, pool, "pooler:xact")
	defer release()
	err = fencedpostgres.WithAdvisoryLock(ctx, pool, "pooler:xact", nil, func(context.Context, pgx.Tx) error { return nil })
	if !errors.Is(err, fenced.ErrHeld) {
		t.Fatalf("transaction-scoped lock through the pooler while held: %v, want ErrHeld", err)
	}
}
