package fencedmysql_test

import (
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedmysql"
	"github.com/fenced-dev/fenced/internal/core/rootaccess"
	"github.com/fenced-dev/fenced/internal/core/storeurl"
	"github.com/fenced-dev/fenced/mem"
)

// TestDSN: the application opens its own pool to the lease store's
// database from the store URL, which go-sql-driver cannot parse.
func TestDSN(t *testing.T) {
	ctx := ctxT(t)
	for _, storeURL := range []string{my.URL("table=shared_leases"), my.URL("table=shared_leases", "socket="+my.Socket())} {
		dsn, err := fencedmysql.DSN(storeURL)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(dsn, "table=") || strings.Contains(dsn, "socket=") {
			t.Errorf("DSN kept a fenced parameter: %s", storeurl.Redact(storeURL))
		}
		db, err := sql.Open("mysql", dsn)
		if err != nil {
			t.Fatal(err)
		}
		var name string
		err = db.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&name)
		db.Close()
		if err != nil || name != my.Database {
			t.Fatalf("database/sql on DSN(%s): %q %v", storeurl.Redact(storeURL), name, err)
		}
	}
	for _, bad := range []string{"postgres://u:pw-secret@h/db", "mysql://u:pw-secret@h/db?table=a;b", "mysql://u:pw-secret@h/", ""} {
		_, err := fencedmysql.DSN(bad)
		if !errors.Is(err, fenced.ErrInvalidURL) || strings.Contains(err.Error(), "pw-secret") {
			t.Errorf("DSN(%q) = %v, want ErrInvalidURL without the password", bad, err)
		}
	}
}

func TestDBOf(t *testing.T) {
	ctx := ctxT(t)
	client, err := fenced.Open(ctx, my.URL("table=shared_leases"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	db, err := fencedmysql.DBOf(client)
	if err != nil || db != rootaccess.Driver(client).(*fencedmysql.Driver).DB() || rootaccess.Driver(client).(*fencedmysql.Driver).Table() != "shared_leases" {
		t.Fatalf("DBOf: %v %v", db, err)
	}
	if err := db.PingContext(ctx); err != nil {
		t.Fatal(err)
	}
	other := fenced.NewClient(mem.New(nil), nil)
	defer other.Close()
	if _, err := fencedmysql.DBOf(other); err == nil || !strings.Contains(err.Error(), "not MySQL") {
		t.Fatalf("DBOf on a mem client: %v", err)
	}
}
