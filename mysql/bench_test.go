package mysql_test

import (
	"database/sql"
	"fmt"
	"net/url"
	"testing"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/leasebench"
	"github.com/fenced-dev/fenced/mysql"
)

// benchClient opens a client over its own *sql.DB whose connections count
// round trips in rt (nil: not counted).
func benchClient(b *testing.B, rt *leasebench.RoundTrips, opts *fenced.Options) *fenced.Client {
	b.Helper()
	u, err := url.Parse(my.URL())
	if err != nil {
		b.Fatal(err)
	}
	cfg, table, err := mysql.Config(u)
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
	d, err := mysql.New(ctxT(b), db, &mysql.Options{Table: table})
	if err != nil {
		b.Fatal(err)
	}
	return fenced.NewClient(d, opts)
}

// BenchmarkAcquireRelease: uncontended TryAcquire + Release of one key.
func BenchmarkAcquireRelease(b *testing.B) {
	var rt leasebench.RoundTrips
	c := benchClient(b, &rt, nil)
	defer c.Close()
	leasebench.AcquireRelease(b, c, &rt)
}

// BenchmarkHandover: release to next grant with 1, 8 and 64 polling
// waiters, with the client's default backoff (10ms to 1s, full jitter) and
// with a tighter one (1ms to 50ms).
func BenchmarkHandover(b *testing.B) {
	for _, tight := range []bool{false, true} {
		for _, n := range []int{1, 8, 64} {
			opts := &fenced.Options{}
			name := "backoff=default"
			if tight {
				opts = &fenced.Options{MinBackoff: 1e6, MaxBackoff: 50e6}
				name = "backoff=1ms-50ms"
			}
			b.Run(fmt.Sprintf("%s/waiters=%d", name, n), func(b *testing.B) {
				leasebench.Handover(b, n, func(b *testing.B) *fenced.Client { return benchClient(b, nil, opts) })
			})
		}
	}
}
