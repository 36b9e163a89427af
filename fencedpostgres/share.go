package fencedpostgres

import (
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/backend/leasetable"
	"github.com/fenced-dev/fenced/internal/backend/urlquery"
	"github.com/fenced-dev/fenced/internal/core/rootaccess"
	"github.com/fenced-dev/fenced/internal/core/storeurl"
)

// DatabaseURL returns a store URL without fenced's own query parameters
// (table, notify) and the pool_* settings of fenced's pool. pgx
// (pgxpool.New, pgx.Connect), database/sql's "pgx" driver and libpq accept
// its form. An application opens its own pool to the lease store's database
// with it. The store URL itself is refused by them (PostgreSQL rejects
// "table" as an unknown setting). Errors match fenced.ErrInvalidURL and
// never contain the password.
func DatabaseURL(rawURL string) (string, error) {
	u, err := storeurl.Parse(rawURL)
	if err != nil {
		return "", err
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return "", fmt.Errorf("postgres: %s: %w: scheme %q, want postgres or postgresql",
			storeurl.Redact(rawURL), fenced.ErrInvalidURL, u.Scheme)
	}
	p, err := urlquery.Parse(u.RawQuery)
	if err != nil {
		return "", fmt.Errorf("postgres: %s: %w", storeurl.Redact(rawURL), err)
	}
	// fenced's own parameters; the store URL's values were checked when
	// the store was opened.
	p.Take(leasetable.TableParam)
	p.Take(paramNotify)
	q := p.Rest()
	for k := range q {
		if strings.HasPrefix(k, "pool_") {
			delete(q, k) // the sizing of fenced's pool, which pgx.Connect refuses
		}
	}
	u.RawQuery = urlquery.Encode(q)
	return u.String(), nil
}

// PoolOf returns the connection pool of a client whose store is
// PostgreSQL (opened by URL, or over a pool with New), or an error if it
// is another backend.
//
// Renewals go through this pool. A renewal waits for a free connection no
// longer than the lease's remaining local validity. The validity it grants
// counts from before that wait. So a busy pool can never make a lease
// outlive its grant. But if the application keeps every connection busy for
// longer than that, the lease expires (ErrExpired) and its work is
// cancelled. So use the pool only for short statements, such as the guarded
// writes of the lease holder. Run the application's own traffic on a pool of
// its own (DatabaseURL gives the URL for it). A client opened by URL has a
// pool nobody else uses unless PoolOf hands it out. Size the pool with the
// URL's pool_max_conns.
func PoolOf(c *fenced.Client) (*pgxpool.Pool, error) {
	d, ok := rootaccess.Driver(c).(*Driver)
	if !ok {
		return nil, fmt.Errorf("postgres: PoolOf: the client's store is %T, not PostgreSQL", rootaccess.Driver(c))
	}
	return d.Pool(), nil
}
