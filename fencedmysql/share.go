package fencedmysql

import (
	"database/sql"
	"fmt"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/core/rootaccess"
	"github.com/fenced-dev/fenced/internal/core/storeurl"
)

// DB returns the driver's *sql.DB, for an application that wants to share
// it. Renewals use it too (see DBOf).
func (d *Driver) DB() *sql.DB { return d.db }

// Table returns the lease table's name.
func (d *Driver) Table() string { return d.table }

// DSN converts a mysql:// store URL to a go-sql-driver DSN for
// sql.Open("mysql", dsn). It drops fenced's own parameters (table, and
// socket, which becomes the DSN's unix address). It keeps the settings
// fenced's own connections use: interpolateParams=true and a 10 s connect
// timeout, unless the URL sets them. An application opens its own pool to
// the lease store's database with it. Errors match fenced.ErrInvalidURL and
// never contain the password.
func DSN(rawURL string) (string, error) {
	u, err := storeurl.Parse(rawURL)
	if err != nil {
		return "", err
	}
	if u.Scheme != "mysql" {
		return "", fmt.Errorf("mysql: %s: %w: scheme %q, want mysql", storeurl.Redact(rawURL), fenced.ErrInvalidURL, u.Scheme)
	}
	cfg, _, err := Config(u)
	if err != nil {
		return "", fmt.Errorf("mysql: %s: %w", storeurl.Redact(rawURL), err)
	}
	return cfg.FormatDSN(), nil
}

// DBOf returns the *sql.DB of a client whose store is MySQL or MariaDB
// (opened by URL, or over a *sql.DB with New), or an error if it is
// another backend.
//
// Renewals go through this pool. A renewal waits for a connection no longer
// than the lease's remaining local validity. The validity it grants counts
// from before that wait. So a busy pool can never make a lease outlive its
// grant. But the application may keep every connection busy for longer than
// that (after SetMaxOpenConns, or when the server's max_connections is
// reached). The lease then expires (ErrExpired) and its work is cancelled. A
// client opened by URL has a pool without a limit on open connections that
// nobody else uses unless DBOf hands it out. Use it for short statements,
// such as the holder's guarded writes, and run the application's own traffic
// on a pool of its own (DSN gives its DSN).
func DBOf(c *fenced.Client) (*sql.DB, error) {
	d, ok := rootaccess.Driver(c).(*Driver)
	if !ok {
		return nil, fmt.Errorf("mysql: DBOf: the client's store is %T, not MySQL", rootaccess.Driver(c))
	}
	return d.db, nil
}
