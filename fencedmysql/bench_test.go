package fencedmysql_test

import (
	"database/sql"
	"net/url"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/fencedmysql"
	"github.com/fenced-dev/fenced/internal/testkit/leasebench"
)

// benchDriver opens a driver over its own *sql.DB whose connections count
// round trips in rt (nil: not counted).
func benchDriver(b *testing.B, rt *leasebench.RoundTrips) driver.Driver {
	b.Helper()
	u, err := url.Parse(my.URL())
	if err != nil {
		b.Fatal(err)
	}
	cfg, table, err := fencedmysql.Config(u)
	if err != nil {
		b.Fatal(err)
	}
	if rt != nil {
		cfg.DialFunc = rt.Dial
	}
	conn, err := gomysql.NewConnector(cfg)
	if err != nil {
		b.Fatal(err)
	}
	db := sql.OpenDB(conn)
	b.Cleanup(func() { db.Close() })
	d, err := fencedmysql.New(ctxT(b), db, &fencedmysql.Options{Table: table})
	if err != nil {
		b.Fatal(err)
	}
	return d
}

// BenchmarkLeases runs the shared benchmarks (leasebench.Run)
// with the client's default backoff (10ms to 1s, full jitter) and with a
// tighter one (1ms to 50ms): MySQL's waiters poll.
func BenchmarkLeases(b *testing.B) {
	for _, tight := range []bool{false, true} {
		opts := &fenced.Options{}
		name := "backoff=default"
		if tight {
			opts = &fenced.Options{MinBackoff: time.Millisecond, MaxBackoff: 50 * time.Millisecond}
			name = "backoff=1ms-50ms"
		}
		b.Run(name, func(b *testing.B) {
			leasebench.Run(b, leasebench.Harness{Open: benchDriver, CountsRoundTrips: true, Options: opts})
		})
	}
}
