package fencedpostgres_test

import (
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedpostgres"
	"github.com/fenced-dev/fenced/internal/core/rootaccess"
	"github.com/fenced-dev/fenced/internal/core/storeurl"
	"github.com/fenced-dev/fenced/mem"
)

// TestDatabaseURL: the application opens its own pool to the lease store's
// database from the store URL. The store URL itself is refused by
// database/sql's pgx driver (PostgreSQL rejects "table"), which is what
// users ran into.
func TestDatabaseURL(t *testing.T) {
	ctx := ctxT(t)
	storeURL := pg.URL("table=shared_leases", "notify=off", "pool_max_conns=3")
	if db, err := sql.Open("pgx", storeURL); err == nil {
		err = db.PingContext(ctx)
		db.Close()
		if err == nil {
			t.Log("note: pgx now accepts the store URL as it is")
		}
	}
	dbURL, err := fencedpostgres.DatabaseURL(storeURL)
	if err != nil {
		t.Fatal(err)
	}
	for _, gone := range []string{"table=", "notify=", "pool_max_conns"} {
		if strings.Contains(dbURL, gone) {
			t.Errorf("DatabaseURL kept %q: %s", gone, storeurl.Redact(dbURL))
		}
	}
	if !strings.Contains(dbURL, "sslmode=disable") {
		t.Errorf("DatabaseURL dropped the connection settings: %s", storeurl.Redact(dbURL))
	}
	db, err := sql.Open("pgx", dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.PingContext(ctx); err != nil {
		t.Fatalf("database/sql on DatabaseURL: %v", err)
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("pgxpool on DatabaseURL: %v", err)
	}
	for _, bad := range []string{"mysql://u:pw-secret@h/db", "postgres://u:pw-secret@h/db?table=a;b", "", "postgres://u:pw-secret@h:x/db"} {
		_, err := fencedpostgres.DatabaseURL(bad)
		if !errors.Is(err, fenced.ErrInvalidURL) || strings.Contains(err.Error(), "pw-secret") {
			t.Errorf("DatabaseURL(%q) = %v, want ErrInvalidURL without the password", bad, err)
		}
	}
}

func TestPoolOf(t *testing.T) {
	ctx := ctxT(t)
	client, err := fenced.Open(ctx, pg.URL("table=shared_leases", "notify=off"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	pool, err := fencedpostgres.PoolOf(client)
	if err != nil || pool != rootaccess.Driver(client).(*fencedpostgres.Driver).Pool() {
		t.Fatalf("PoolOf: %v %v", pool, err)
	}
	if err := pool.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	other := fenced.NewClient(mem.New(nil), nil)
	defer other.Close()
	if _, err := fencedpostgres.PoolOf(other); err == nil || !strings.Contains(err.Error(), "not PostgreSQL") {
		t.Fatalf("PoolOf on a mem client: %v", err)
	}
}

// TestRenewalsAndABusyPool shows what the documentation of PoolOf says:
// an application that keeps its own pool busy does not disturb fenced's
// renewals, and one that holds every connection of fenced's pool for longer
// than the TTL makes the lease expire (never outlive its grant).
func TestRenewalsAndABusyPool(t *testing.T) {
	if testing.Short() {
		t.Skip("long: holds the pool past the TTL; run without -short")
	}
	t.Parallel()
	ctx := ctxT(t)
	const ttl = 2 * time.Second
	storeURL := pg.URL("table=busy_pool_leases", "notify=off", "pool_max_conns=2")
	client, err := fenced.Open(ctx, storeURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	dbURL, err := fencedpostgres.DatabaseURL(storeURL)
	if err != nil {
		t.Fatal(err)
	}
	app, err := pgxpool.New(ctx, dbURL+"&pool_max_conns=1")
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()

	// The application's own pool is saturated for longer than the TTL.
	l, err := client.TryAcquire(ctx, "job:1", &fenced.LeaseOptions{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := app.Exec(ctx, "SELECT pg_sleep(3)"); err != nil {
		t.Fatal(err)
	}
	if err := l.Err(); err != nil {
		t.Fatalf("the lease ended while only the application's pool was busy: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// Every connection of fenced's own pool held by the application.
	l, err = client.TryAcquire(ctx, "job:2", &fenced.LeaseOptions{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := fencedpostgres.PoolOf(client)
	if err != nil {
		t.Fatal(err)
	}
	for range int(pool.Config().MaxConns) {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Release()
	}
	select {
	case <-l.Context().Done():
	case <-time.After(3 * ttl):
		t.Fatal("the lease outlived its TTL while no renewal could reach the database")
	}
	if !fenced.IsLost(l.Err()) || !errors.Is(l.Err(), fenced.ErrExpired) {
		t.Fatalf("lease ended with %v, want ErrExpired", l.Err())
	}
}
