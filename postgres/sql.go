package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/leasetable"
)

// statements are the driver's SQL, built once from the validated table
// name. Values always travel as bind parameters.
type statements struct {
	acquire, renew, renewBatch, release     string
	inspect, list, lockRow, breakRow, audit string
	breaks                                  string
}

// quoteIdent quotes a (validated) identifier for PostgreSQL.
func quoteIdent(name string) string {
	return `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
}

// remainingExpr is the time left on a row's grant in microseconds, by the
// database's clock.
const remainingExpr = `(extract(epoch FROM (expires_at - now())) * 1000000)::bigint`

func newStatements(table string) statements {
	t := quoteIdent(table)
	b := quoteIdent(table + leasetable.BreaksSuffix)
	return statements{
		// One statement: grant if free, expired or already ours (then the
		// fence is kept and the expiry extended), else report how long the
		// holder has left. The upsert (INSERT ... ON CONFLICT DO UPDATE ...
		// WHERE free or expired RETURNING fence) decides under the row lock
		// on the latest row version. Two reads in front of it keep a crowd
		// of woken waiters from queueing on that lock (each waiter would
		// otherwise take it in turn, and its commit would wait for a WAL
		// flush): cur reads the row in the statement's snapshot, and a row
		// visibly held by another owner is refused as a plain read; lk
		// locks a row that looks free with SKIP LOCKED, so a waiter that
		// finds another transaction already working on the row (most
		// likely the waiter that wins, or a release whose notification
		// follows) is refused at once instead of waiting behind it.
		acquire: `WITH cur AS (
  SELECT owner, expires_at FROM ` + t + ` WHERE lease_key = $1
), lk AS (
  SELECT FROM ` + t + ` WHERE lease_key = $1 AND NOT (owner <> '' AND owner <> $2 AND expires_at > now())
  FOR UPDATE SKIP LOCKED
), granted AS (
  INSERT INTO ` + t + ` AS l (lease_key, owner, fence, expires_at)
  SELECT $1, $2, 1, now() + $3::bigint * interval '1 microsecond'
   WHERE EXISTS (SELECT FROM lk) OR NOT EXISTS (SELECT FROM cur)
  ON CONFLICT (lease_key) DO UPDATE
     SET fence = CASE WHEN l.owner = excluded.owner AND l.expires_at > now() THEN l.fence ELSE l.fence + 1 END,
         owner = excluded.owner,
         expires_at = excluded.expires_at
   WHERE l.owner = '' OR l.expires_at <= now() OR l.owner = excluded.owner
  RETURNING l.fence
)
SELECT fence, 0::bigint FROM granted
UNION ALL
SELECT 0::bigint, ` + remainingExpr + ` FROM cur WHERE NOT EXISTS (SELECT FROM granted)`,
		renew: `UPDATE ` + t + ` SET expires_at = now() + $4::bigint * interval '1 microsecond'
 WHERE lease_key = $1 AND owner = $2 AND fence = $3 AND expires_at > now()`,
		renewBatch: `UPDATE ` + t + ` AS l SET expires_at = now() + r.ttl * interval '1 microsecond'
  FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) AS r(lease_key, owner, fence, ttl)
 WHERE l.lease_key = r.lease_key AND l.owner = r.owner AND l.fence = r.fence AND l.expires_at > now()
RETURNING l.lease_key, l.owner, l.fence`,
		// Release keeps the row (and so the counter) and wakes the key's
		// waiters in the same statement; the notification is delivered at
		// commit.
		release: `WITH released AS (
  UPDATE ` + t + ` SET owner = '', expires_at = now()
   WHERE lease_key = $1 AND owner = $2 AND fence = $3
  RETURNING lease_key
)
SELECT pg_notify($4, lease_key) FROM released`,
		inspect:  `SELECT owner, fence, ` + remainingExpr + ` FROM ` + t + ` WHERE lease_key = $1`,
		list:     `SELECT lease_key, owner, fence, ` + remainingExpr + ` FROM ` + t + ` WHERE starts_with(lease_key, $1) AND owner <> '' AND expires_at > now() ORDER BY lease_key COLLATE "C"`,
		lockRow:  `SELECT owner, fence, ` + remainingExpr + ` FROM ` + t + ` WHERE lease_key = $1 FOR UPDATE`,
		breakRow: `UPDATE ` + t + ` SET owner = '', expires_at = now() WHERE lease_key = $1`,
		audit:    `INSERT INTO ` + b + ` (lease_key, fence, owner, reason, broken_by) VALUES ($1, $2, $3, $4, $5)`,
		breaks:   `SELECT ` + leasetable.BreakColumns + ` FROM ` + b + ` WHERE $1 = '' OR lease_key = $1 ORDER BY id`,
	}
}

// The shapes the driver needs, as pg_catalog's format_type reports them.
var (
	leaseShape = []leasetable.Column{
		{Name: "lease_key", Type: "text"},
		{Name: "owner", Type: "text"},
		{Name: "fence", Type: "bigint"},
		{Name: "expires_at", Type: "timestamp with time zone"},
	}
	breakShape = []leasetable.Column{
		{Name: "id", Type: "bigint"},
		{Name: "broken_at", Type: "timestamp with time zone"},
		{Name: "lease_key", Type: "text"},
		{Name: "fence", Type: "bigint"},
		{Name: "owner", Type: "text"},
		{Name: "reason", Type: "text"},
		{Name: "broken_by", Type: "text"},
	}
)

// ensureSchema creates the tables if missing and checks the shape of those
// that exist. Concurrent starters serialize on a transaction-scoped
// advisory lock, which (unlike a session lock) is safe behind a pooler.
func (d *Driver) ensureSchema(ctx context.Context) error {
	t, b := d.table, d.table+leasetable.BreaksSuffix
	err := pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, AdvisoryKey("fenced schema "+t)); err != nil {
			return err
		}
		for _, s := range []struct {
			name   string
			shape  []leasetable.Column
			create string
		}{
			{t, leaseShape, `CREATE TABLE ` + quoteIdent(t) + ` (
  lease_key  text COLLATE "C" PRIMARY KEY,
  owner      text NOT NULL,
  fence      bigint NOT NULL CHECK (fence > 0),
  expires_at timestamptz NOT NULL
)`},
			{b, breakShape, `CREATE TABLE ` + quoteIdent(b) + ` (
  id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  broken_at  timestamptz NOT NULL DEFAULT now(),
  lease_key  text COLLATE "C" NOT NULL,
  fence      bigint NOT NULL,
  owner      text NOT NULL,
  reason     text NOT NULL,
  broken_by  text NOT NULL
);
CREATE INDEX ` + quoteIdent(b+"_key") + ` ON ` + quoteIdent(b) + ` (lease_key, id)`},
		} {
			cols, exists, err := columns(ctx, tx, s.name)
			if err != nil {
				return err
			}
			if !exists {
				for _, stmt := range strings.Split(s.create, ";\n") {
					if _, err := tx.Exec(ctx, stmt); err != nil {
						return fmt.Errorf("create table %q: %w", s.name, err)
					}
				}
				continue
			}
			if err := leasetable.CheckShape(s.name, s.shape, cols, true); err != nil {
				return err
			}
		}
		// ON CONFLICT (lease_key) needs a unique index on exactly that column.
		var unique bool
		err := tx.QueryRow(ctx, `SELECT EXISTS (
  SELECT FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
   WHERE i.indrelid = to_regclass($1) AND i.indisunique AND i.indnkeyatts = 1 AND a.attname = 'lease_key')`,
			quoteIdent(t)).Scan(&unique)
		if err != nil {
			return err
		}
		if !unique {
			return fmt.Errorf("%w: table %q has no primary key or unique index on lease_key alone", leasetable.ErrSchema, t)
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, leasetable.ErrSchema) {
			return fmt.Errorf("postgres: %w", err)
		}
		return classify("prepare tables", t, err)
	}
	return nil
}

// columns returns the columns of table (as the search path resolves it)
// and their types, and whether the table exists.
func columns(ctx context.Context, tx pgx.Tx, table string) (map[string]string, bool, error) {
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, quoteIdent(table)).Scan(&exists); err != nil || !exists {
		return nil, false, err
	}
	rows, err := tx.Query(ctx, `SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
 WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped`, quoteIdent(table))
	if err != nil {
		return nil, true, err
	}
	cols := map[string]string{}
	var name, typ string
	_, err = pgx.ForEachRow(rows, []any{&name, &typ}, func() error {
		cols[name] = typ
		return nil
	})
	return cols, true, err
}

// classify wraps err from operation op so that it matches the driver
// sentinels: driver.ErrUnavailable when nothing can have been applied (no
// connection, a statement the server rejected and rolled back),
// driver.ErrUnknownOutcome when a request may have been applied before the
// connection or the context failed.
func classify(op, key string, err error) error {
	where := op
	if key != "" {
		where = fmt.Sprintf("%s %q", op, key)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code[:2] {
		case "08", "28", "40", "53", "57", "58":
			// Connection problems, authentication, rollbacks (deadlock,
			// serialization), resources, shutdown, system errors: the
			// statement failed as a whole and changed nothing.
			return fmt.Errorf("postgres: %s: %w: %w", where, driver.ErrUnavailable, err)
		}
		return fmt.Errorf("postgres: %s: %w", where, err)
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) || pgconn.SafeToRetry(err) {
		return fmt.Errorf("postgres: %s: %w: %w", where, driver.ErrUnavailable, err)
	}
	var netErr net.Error
	if errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err) ||
		strings.Contains(err.Error(), "conn closed") {
		return fmt.Errorf("postgres: %s: %w: %w", where, driver.ErrUnknownOutcome, err)
	}
	return fmt.Errorf("postgres: %s: %w", where, err)
}
