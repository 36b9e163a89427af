package fencedpostgres_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/fencedpostgres"
	"github.com/fenced-dev/fenced/internal/core/capability"
)

func signalled(c <-chan struct{}, within time.Duration) bool {
	select {
	case <-c:
		return true
	case <-time.After(within):
		return false
	}
}

// A release wakes the waiters of that key only.
func TestReleaseWakesOnlyThatKey(t *testing.T) {
	ctx := ctxT(t)
	waiter, holder := open(t), open(t)
	if !capability.Of(waiter).Notifies() {
		t.Fatalf("driver does not declare notifications: %s", waiter.Capabilities().Note)
	}
	keyA, keyB := "fanout:a:"+t.Name(), "fanout:b:"+t.Name()
	fa, err := holder.TryAcquire(ctx, keyA, "holder-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := holder.TryAcquire(ctx, keyB, "holder-b", time.Minute); err != nil {
		t.Fatal(err)
	}
	subA, err := waiter.Subscribe(ctx, keyA)
	if err != nil {
		t.Fatal(err)
	}
	defer subA.Close()
	subB, err := waiter.Subscribe(ctx, keyB)
	if err != nil {
		t.Fatal(err)
	}
	defer subB.Close()
	// A driver that becomes the head of a key's line lets one waiter
	// look once (a release may have come before it listened).
	if !signalled(subA.C(), 10*time.Second) || !signalled(subB.C(), 10*time.Second) {
		t.Fatal("the only waiter of a key was not woken when its driver became head of the line")
	}
	if err := holder.Release(ctx, driver.Grant{Key: keyA, Owner: "holder-a", Fence: fa}); err != nil {
		t.Fatal(err)
	}
	if !signalled(subA.C(), 10*time.Second) {
		t.Fatal("the waiter of the released key was not woken")
	}
	if signalled(subB.C(), 500*time.Millisecond) {
		t.Fatal("a release of one key woke the waiter of another key")
	}
	// A break notifies too.
	if _, err := holder.Break(ctx, keyB, "test", t.Name()); err != nil {
		t.Fatal(err)
	}
	if !signalled(subB.C(), 10*time.Second) {
		t.Fatal("the waiter of a broken key was not woken")
	}
}

// When the LISTEN connection cannot see the pool's notifications (here it
// listens in another database, as it would behind a transaction-mode
// pooler), the driver says so and waiters poll.
func TestNotifyDegradesToPollingAndSaysSo(t *testing.T) {
	ctx := ctxT(t)
	admin, err := pgx.Connect(ctx, pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	for _, q := range []string{"DROP DATABASE IF EXISTS elsewhere", "CREATE DATABASE elsewhere"} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	pool, err := pgxpool.New(ctx, pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	lcfg := pool.Config().ConnConfig.Copy()
	lcfg.Database = "elsewhere"
	d, err := fencedpostgres.New(ctx, pool, &fencedpostgres.Options{ListenConfig: lcfg, ProbeTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	g, notified := d.Capabilities(), capability.Of(d).Notifies()
	if notified || !strings.Contains(g.Note, "LISTEN unavailable") || !strings.Contains(g.Note, "poll") {
		t.Fatalf("degraded driver declares %+v, notified waiters %v", g, notified)
	}
	if _, err := d.Subscribe(ctx, "k"); err == nil {
		t.Fatal("Subscribe succeeded on a driver without notifications")
	}
	// Waiting still works, by polling.
	holder, waiter := fenced.NewClient(open(t), nil), fenced.NewClient(d, &fenced.Options{MaxBackoff: 50 * time.Millisecond})
	defer holder.Close()
	key := "degraded:" + t.Name()
	l, err := holder.TryAcquire(ctx, key, &fenced.LeaseOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(200*time.Millisecond, func() { l.Release(context.Background()) })
	l2, err := waiter.Acquire(ctx, key, &fenced.LeaseOptions{MaxWait: 20 * time.Second})
	if err != nil {
		t.Fatalf("polling waiter: %v", err)
	}
	l2.Release(ctx)
}

// If the LISTEN connection dies, the driver reconnects, wakes its waiters
// (releases may have been missed meanwhile) and delivers later releases.
func TestListenerSurvivesLostConnection(t *testing.T) {
	ctx := ctxT(t)
	admin, err := pgx.Connect(ctx, pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	waiter, holder := open(t, "table=reconnect_leases"), open(t, "table=reconnect_leases")
	key := "reconnect:" + t.Name()
	f, err := holder.TryAcquire(ctx, key, "holder", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := waiter.Subscribe(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	// Only the waiting driver listens, on the connection that heads the
	// key's line: an idle driver does not make the server signal it at
	// every NOTIFY.
	listeners := func() int {
		var n int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN "reconnect_leases_free"'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if !signalled(sub.C(), 10*time.Second) {
		t.Fatal("the only waiter was not woken when its driver became head of the line")
	}
	if n := listeners(); n != 1 {
		t.Fatalf("%d LISTEN connections for one waiting and one idle driver, want 1", n)
	}
	if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = 'LISTEN "reconnect_leases_free"'`); err != nil {
		t.Fatal(err)
	}
	if !signalled(sub.C(), 10*time.Second) {
		t.Fatal("waiter not woken when its LISTEN connection was lost")
	}
	deadline := time.Now().Add(30 * time.Second)
	for listeners() < 1 {
		if time.Now().After(deadline) {
			t.Fatal("LISTEN connections not re-established")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Drain the wake-up of the reconnect itself.
	signalled(sub.C(), 100*time.Millisecond)
	if err := holder.Release(ctx, driver.Grant{Key: key, Owner: "holder", Fence: f}); err != nil {
		t.Fatal(err)
	}
	if !signalled(sub.C(), 10*time.Second) {
		t.Fatal("release after the reconnect did not wake the waiter")
	}
}

// Renewal of many leases of one client is one statement.
func TestBatchRenewalIsOneStatement(t *testing.T) {
	ctx := ctxT(t)
	counter := &statementCounter{}
	cfg, err := pgxpool.ParseConfig(pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = counter
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	d, err := fencedpostgres.New(ctx, pool, &fencedpostgres.Options{DisableNotify: true})
	if err != nil {
		t.Fatal(err)
	}
	var grants []driver.Grant
	for i := range 50 {
		g := driver.Grant{Key: t.Name() + ":" + string(rune('a'+i%26)) + string(rune('a'+i/26)), Owner: "o", TTL: time.Minute}
		if g.Fence, err = d.TryAcquire(ctx, g.Key, g.Owner, g.TTL); err != nil {
			t.Fatal(err)
		}
		grants = append(grants, g)
	}
	before := counter.n.Load()
	errs, err := d.RenewBatch(ctx, grants)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range errs {
		if e != nil {
			t.Fatalf("request %d: %v", i, e)
		}
	}
	if n := counter.n.Load() - before; n != 1 {
		t.Fatalf("renewing %d leases took %d statements, want 1", len(grants), n)
	}
}
