package fencedpostgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/backend/leasetable"
	"github.com/fenced-dev/fenced/internal/backend/sqlident"
	"github.com/fenced-dev/fenced/internal/backend/sqllease"
)

// statements are the driver's SQL, built once from the validated table
// name. Values always travel as bind parameters.
type statements struct {
	acquire, renew, renewBatch, release     string
	inspect, list, lockRow, breakRow, audit string
	breaks                                  string
	floor, raiseFloor, pruneCutoff, prune   string
	lockForPrune                            string
}

// quoteIdent quotes a (validated) identifier for PostgreSQL.
func quoteIdent(name string) string { return sqlident.QuoteANSI(name) }

// remainingExpr is the time left on a row's grant in microseconds, by the
// database's clock.
const remainingExpr = `(extract(epoch FROM (expires_at - now())) * 1000000)::bigint`

func newStatements(table string) statements {
	t := quoteIdent(table)
	b := quoteIdent(table + leasetable.BreaksSuffix)
	f := quoteIdent(table + leasetable.FloorSuffix)
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
		//
		// The fence of a grant is one more than the larger of the row's
		// counter and the table's fence floor; a new row starts at floor
		// + 1 (excluded.fence). The floor is read in the statement's
		// snapshot. That snapshot can be older than a prune that commits
		// while the statement runs: the insert may wait for another
		// grant's insert of the key, which is then released and pruned
		// before this one retries into the empty slot with its old floor.
		// So a prune batch locks the lease table against every writer
		// (see lockForPrune): this statement takes its table lock before
		// its snapshot, and either finishes before the batch starts or
		// starts after it committed.
		acquire: `WITH cur AS (
  SELECT owner, expires_at FROM ` + t + ` WHERE lease_key = $1
), lk AS (
  SELECT FROM ` + t + ` WHERE lease_key = $1 AND NOT (owner <> '' AND owner <> $2 AND expires_at > now())
  FOR UPDATE SKIP LOCKED
), granted AS (
  INSERT INTO ` + t + ` AS l (lease_key, owner, fence, expires_at)
  SELECT $1, $2, COALESCE((SELECT fence_floor FROM ` + f + ` WHERE id = 1), 0) + 1, now() + $3::bigint * interval '1 microsecond'
   WHERE EXISTS (SELECT FROM lk) OR NOT EXISTS (SELECT FROM cur)
  ON CONFLICT (lease_key) DO UPDATE
     SET fence = CASE WHEN l.owner = excluded.owner AND l.expires_at > now() THEN l.fence ELSE GREATEST(l.fence + 1, excluded.fence) END,
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
		inspect: `SELECT owner, fence, ` + remainingExpr + ` FROM ` + t + ` WHERE lease_key = $1`,
		list: `SELECT lease_key, owner, fence, ` + remainingExpr + ` FROM ` + t +
			` WHERE starts_with(lease_key, $1) AND owner <> '' AND expires_at > now() ORDER BY lease_key COLLATE "C"`,
		lockRow:  `SELECT owner, fence, ` + remainingExpr + ` FROM ` + t + ` WHERE lease_key = $1 FOR UPDATE`,
		breakRow: `UPDATE ` + t + ` SET owner = '', expires_at = now() WHERE lease_key = $1`,
		audit:    `INSERT INTO ` + b + ` (lease_key, fence, owner, reason, broken_by) VALUES ($1, $2, $3, $4, $5)`,
		breaks:   `SELECT ` + leasetable.BreakColumns + ` FROM ` + b + ` WHERE $1 = '' OR lease_key = $1 ORDER BY id`,
		floor:    `SELECT COALESCE((SELECT fence_floor FROM ` + f + ` WHERE id = 1), 0), COALESCE((SELECT max(fence) FROM ` + t + `), 0)`,
		raiseFloor: `INSERT INTO ` + f + ` AS fl (id, fence_floor) VALUES (1, $1)
ON CONFLICT (id) DO UPDATE SET fence_floor = GREATEST(fl.fence_floor, excluded.fence_floor)
RETURNING fence_floor`,
		pruneCutoff: `SELECT now() - $1::bigint * interval '1 microsecond'`,
		// One batch of a prune, after lockForPrune in the same
		// transaction, so no row can change meanwhile: delete up to $3
		// rows after key $1 that expired before $2, and raise the floor
		// to the highest fence deleted.
		lockForPrune: `LOCK TABLE ` + t + ` IN SHARE ROW EXCLUSIVE MODE`,
		prune: `WITH victims AS (
  SELECT lease_key FROM ` + t + ` WHERE lease_key > $1 AND expires_at < $2 ORDER BY lease_key LIMIT $3
), del AS (
  DELETE FROM ` + t + ` d USING victims v WHERE d.lease_key = v.lease_key RETURNING d.fence
), raised AS (
  INSERT INTO ` + f + ` AS fl (id, fence_floor) SELECT 1, max(fence) FROM del HAVING count(*) > 0
  ON CONFLICT (id) DO UPDATE SET fence_floor = GREATEST(fl.fence_floor, excluded.fence_floor)
  RETURNING fence_floor
)
SELECT (SELECT count(*) FROM victims), COALESCE((SELECT max(lease_key) FROM victims), ''), (SELECT count(*) FROM del),
       COALESCE((SELECT fence_floor FROM raised), (SELECT fence_floor FROM ` + f + ` WHERE id = 1), 0)`,
	}
}

// The shapes the driver needs, as readTable reports them (types as
// pg_catalog's format_type gives them).
var leaseShape, breakShape, floorShape = leasetable.ColumnTypes{
	Key: "text", Owner: "text", Fence: "bigint", Time: "timestamp with time zone",
	AuditID: "bigint", AuditOwner: "text", AuditText: "text", FloorID: "smallint",
}.Shapes()

// ensureSchema creates the tables if missing and checks the shape of those
// that exist, in one transaction, so that a refusal changes nothing.
// Concurrent starters serialize on a transaction-scoped advisory lock,
// which (unlike a session lock) is safe behind a pooler.
func (d *Driver) ensureSchema(ctx context.Context) error {
	t, b, f := d.table, d.table+leasetable.BreaksSuffix, d.table+leasetable.FloorSuffix
	err := pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, AdvisoryKey("fenced schema "+t)); err != nil {
			return err
		}
		for _, s := range []struct {
			name   string
			shape  leasetable.Shape
			create string
		}{
			{t, leaseShape, `CREATE TABLE ` + quoteIdent(t) + ` (
  lease_key  text COLLATE "C" PRIMARY KEY,
  owner      text COLLATE "C" NOT NULL,
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
			{f, floorShape, `CREATE TABLE ` + quoteIdent(f) + ` (
  id          smallint PRIMARY KEY CHECK (id = 1),
  fence_floor bigint NOT NULL CHECK (fence_floor >= 0)
)`},
			{t + sqllease.CheckpointsSuffix, checkpointsShape, createCheckpoints(t)},
		} {
			found, exists, err := readTable(ctx, tx, s.name)
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
			if err := leasetable.Check(s.name, s.shape, found); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+quoteIdent(f)+` (id, fence_floor) VALUES (1, 0) ON CONFLICT (id) DO NOTHING`)
		return err
	})
	if err != nil {
		if errors.Is(err, leasetable.ErrSchema) {
			return fmt.Errorf("postgres: %w", err)
		}
		return classify("prepare tables", t, err)
	}
	return nil
}

// deterministic is true for a pg_collation row co (or none) whose equality
// is byte for byte. It reads collisdeterministic through to_jsonb, so the
// query also runs on servers older than 12, where every collation is.
const deterministic = `COALESCE((to_jsonb(co) ->> 'collisdeterministic')::boolean, true)`

// readTable reads the shape of table (as the search path resolves it)
// from pg_catalog: its kind, its columns with their types and
// nondeterministic collations, and its unique indexes and exclusion
// constraints. The second result is false when the table does not exist.
func readTable(ctx context.Context, tx pgx.Tx, table string) (leasetable.Existing, bool, error) {
	found := leasetable.Existing{Columns: map[string]leasetable.ExistingColumn{}}
	q := quoteIdent(table)
	var kind *string
	if err := tx.QueryRow(ctx, `SELECT (SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1))`,
		q).Scan(&kind); err != nil || kind == nil {
		return found, false, err
	}
	switch *kind {
	case "r", "p":
	case "v", "m":
		found.Problems = append(found.Problems, "it is a view, not a table")
	default:
		found.Problems = append(found.Problems, fmt.Sprintf("it is a relation of kind %q, not a table", *kind))
	}
	rows, err := tx.Query(ctx, `SELECT a.attname, format_type(a.atttypid, a.atttypmod),
  CASE WHEN `+deterministic+` THEN '' ELSE co.collname END
  FROM pg_attribute a LEFT JOIN pg_collation co ON co.oid = a.attcollation
 WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped`, q)
	if err != nil {
		return found, true, err
	}
	var name, typ, collation string
	_, err = pgx.ForEachRow(rows, []any{&name, &typ, &collation}, func() error {
		c := leasetable.ExistingColumn{Type: typ}
		if collation != "" {
			c.Inexact = fmt.Sprintf("nondeterministic collation %q, which can take different strings for equal", collation)
		}
		found.Columns[name] = c
		return nil
	})
	if err != nil {
		return found, true, err
	}
	rows, err = tx.Query(ctx, `SELECT c.relname, i.indisexclusion, i.indisvalid, i.indimmediate, i.indpred IS NOT NULL,
       ARRAY(SELECT COALESCE(a.attname::text, '') FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, n)
               LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
              WHERE k.n <= i.indnkeyatts ORDER BY k.n),
       COALESCE((SELECT string_agg(co.collname, ', ') FROM unnest(i.indcollation::oid[]) AS ic(oid)
                   JOIN pg_collation co ON co.oid = ic.oid WHERE NOT `+deterministic+`), '')
  FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
 WHERE i.indrelid = to_regclass($1) AND (i.indisunique OR i.indisexclusion)
 ORDER BY c.relname`, q)
	if err != nil {
		return found, true, err
	}
	var exclusion, valid, immediate, partial bool
	var cols []string
	_, err = pgx.ForEachRow(rows, []any{&name, &exclusion, &valid, &immediate, &partial, &cols, &collation}, func() error {
		ix := leasetable.UniqueIndex{Name: name, Columns: cols}
		switch {
		case exclusion:
			ix.Defect = "is an exclusion constraint, which ON CONFLICT DO UPDATE cannot use"
		case !valid:
			ix.Defect = "is invalid (a failed CREATE INDEX CONCURRENTLY?)"
		case !immediate:
			ix.Defect = "is deferrable, which ON CONFLICT cannot use"
		case partial:
			ix.Defect = "has a WHERE clause, so it does not cover every row"
		case collation != "":
			ix.Defect = fmt.Sprintf("uses nondeterministic collation %q, which can take different keys for equal", collation)
		}
		found.Unique = append(found.Unique, ix)
		return nil
	})
	return found, true, err
}

// classify wraps err from operation op on key once (see sqllease.Wrap).
func classify(op, key string, err error) error {
	return sqllease.Wrap("postgres", classifyError, op, key, err)
}

// classifyError names the sentinel a pgx error matches.
// fenced.ErrUnavailable: nothing can have been applied (no connection, a
// statement the server rejected and rolled back). fenced.ErrUnknownOutcome:
// a request may have been applied before the connection or the context
// failed.
func classifyError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code[:2] {
		case "08", "28", "40", "53", "57", "58":
			// Connection problems, authentication, rollbacks (deadlock,
			// serialization), resources, shutdown, system errors: the
			// statement failed as a whole and changed nothing.
			return fenced.ErrUnavailable
		}
		return nil
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) || pgconn.SafeToRetry(err) {
		return fenced.ErrUnavailable
	}
	var netErr net.Error
	if errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err) ||
		strings.Contains(err.Error(), "conn closed") {
		return fenced.ErrUnknownOutcome
	}
	return nil
}

// dialect is PostgreSQL's part of the lease-table engine.
func (d *Driver) dialect() *sqllease.Dialect {
	q := newStatements(d.table)
	grant := func(a sqllease.Args) []any { return []any{a.Key, a.Owner, int64(a.Fence)} }
	return &sqllease.Dialect{
		Name: "postgres",
		Unit: time.Microsecond,
		Statements: sqllease.Statements{
			Renew: sqllease.Stmt{SQL: q.renew},
			Release: sqllease.Stmt{SQL: q.release, Args: func(a sqllease.Args) []any {
				return append(grant(a), d.channel)
			}},
			Inspect:  sqllease.Stmt{SQL: q.inspect},
			List:     sqllease.Stmt{SQL: q.list},
			LockRow:  sqllease.Stmt{SQL: q.lockRow},
			BreakRow: sqllease.Stmt{SQL: q.breakRow},
			Audit:    sqllease.Stmt{SQL: q.audit},
			Notify: sqllease.Stmt{SQL: `SELECT pg_notify($1, $2)`,
				Args: func(a sqllease.Args) []any { return []any{d.channel, a.Key} }},
			Breaks:      sqllease.Stmt{SQL: q.breaks},
			Floor:       sqllease.Stmt{SQL: q.floor},
			PruneCutoff: sqllease.Stmt{SQL: q.pruneCutoff},
			RaiseFloor:  sqllease.Stmt{SQL: q.raiseFloor},
		},
		Acquire: func(ctx context.Context, c sqllease.Conn, key, owner string, us int64) (uint64, int64, error) {
			var fence, remaining int64
			err := c.QueryRow(ctx, q.acquire, key, owner, us).Scan(&fence, &remaining)
			if errors.Is(err, sql.ErrNoRows) {
				// The row appeared after this statement's snapshot:
				// someone else inserted it concurrently and holds it.
				return 0, 0, nil
			}
			return uint64(fence), remaining, err
		},
		RenewBatch: func(ctx context.Context, c sqllease.Conn, reqs []sqllease.Renewal) ([]driver.Grant, error) {
			keys := make([]string, len(reqs))
			owners := make([]string, len(reqs))
			fences := make([]int64, len(reqs))
			ttls := make([]int64, len(reqs))
			for i, r := range reqs {
				keys[i], owners[i], fences[i], ttls[i] = r.Grant.Key, r.Grant.Owner, int64(r.Grant.Fence), r.TTL
			}
			return sqllease.ScanGrants(c.Query(ctx, q.renewBatch, keys, owners, fences, ttls))
		},
		PruneBatch:  q.pruneBatch,
		Classify:    classifyError,
		Checkpoints: checkpointStatements(d.table),
	}
}
