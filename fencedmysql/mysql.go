// Package fencedmysql is the MySQL and MariaDB backend of fenced: a lease table
// whose rows carry the fencing counter, with the same contract as the
// PostgreSQL backend. MySQL has no LISTEN/NOTIFY; waiters are woken by a
// doorbell instead, a named lock (GET_LOCK) per key that the holder frees
// after its release, which wakes one waiter (see Waiting).
//
// Import it for its side effect to open stores by URL:
//
//	import _ "github.com/fenced-dev/fenced/fencedmysql"
//
//	client, err := fenced.Open(ctx, "mysql://app:secret@db.internal:3306/app?table=leases", nil)
//
// or build a driver over a *sql.DB you already have with New.
//
// # URL
//
// mysql://user:password@host:port/database?param=value. The port defaults
// to 3306. fenced's own parameters are:
//
//   - table=NAME: the lease table, default fenced_leases. Lower-case
//     letters, digits and underscores, at most 48 bytes. The audit table is
//     NAME_breaks.
//   - socket=PATH: connect over a unix socket instead of TCP.
//
// Every other parameter is passed to go-sql-driver/mysql (tls, timeout,
// readTimeout, ...). As in that driver, an unknown name is set on the
// server as a session variable when connecting, so sql_mode=... and
// time_zone=... work. A variable the server does not know (a mistyped
// parameter such as tabel=x), or a value it refuses, fails the open with an
// error matching fenced.ErrInvalidURL, not ErrUnavailable. It is a usage
// error, and the store is up.
//
// # Sharing the database
//
// The application may keep its own data, guarded rows included, in the
// lease store's database. Open its own pool with sql.Open("mysql",
// dsn) where dsn is DSN(storeURL), which drops fenced's parameters. DBOf(client)
// returns fenced's *sql.DB, for short statements such as guarded writes;
// renewals use it too, so an application that saturates it delays them
// until leases expire (see DBOf).
//
// # How a lease is kept
//
// Each key has one InnoDB row (lease_key, owner, fence, expires_at), with
// expiry in UTC_TIMESTAMP(6), the server's clock. Acquire is one INSERT ...
// ON DUPLICATE KEY UPDATE under the row lock. It grants when the row is free
// or expired, raises the fence and reports it through LAST_INSERT_ID in the
// reply. So grant and fence take one statement and one round trip. A
// refusal reports the holder's remaining time the same way: a value at or
// above 2^62, a range fences never reach, marks a refusal. Renew and
// release are UPDATEs conditional on owner and fence; release and break
// keep the row, so the counter never restarts. A batch of renewals is one
// UPDATE plus one SELECT that reads back which grants it kept.
//
// Keys and owners are VARBINARY, compared byte for byte. So job:A, job:a
// and "job:a " are three keys, whatever the server's default character set
// and collation (latin1_swedish_ci, MariaDB's default, would take them for
// one). An owner token matches only itself.
//
// # Fence floor and pruning
//
// The table NAME_floor holds one number, the fence floor. A grant's fence
// is one more than the larger of the row's counter and the floor; a new row
// starts at floor + 1. The grant's one statement decides it, reading the
// floor with a shared lock. RaiseFenceFloor raises the floor (fenced floor
// raise). Keys moved from another table or store then start above the
// fences their resources have seen.
//
// Prune (fenced prune) deletes the rows of keys unused for a given time. It
// raises the floor to the highest fence it deleted, in one transaction per
// batch that locks the floor row first. A grant either finishes before the
// batch or reads the raised floor, so no fence is ever reissued. Release
// and break record no time, so a released or broken key is old enough for
// any age.
//
// # Tables made by someone else
//
// New checks the tables that already exist before it creates or changes
// anything. It refuses a table that would break the grant with ErrSchema,
// naming every difference. Such a table has:
//
//   - no primary key or unique index on exactly lease_key. ON DUPLICATE KEY
//     UPDATE would then insert a second row for a key, and grant it to a
//     second owner;
//   - a prefix index, or another unique index;
//   - an extra AUTO_INCREMENT column. Its value would be reported through
//     LAST_INSERT_ID instead of the fence;
//   - character key or owner columns. Their collation could take different
//     keys or owners for one;
//   - columns too short for a key, or expiry without microseconds;
//   - a storage engine other than InnoDB.
//
// # Waiting
//
// Each key has a doorbell: a named lock (GET_LOCK) whose name is a digest
// of the database, the lease table and the key. It is only ever a hint:
// the lease row alone decides owner, fence and expiry. The session that
// holds a key's doorbell is the head of the key's line: the holder that
// won the key while it was contended, or the one waiter polling for it.
// In each process one waiter per key sleeps in SELECT GET_LOCK on a
// connection of its own. It never sleeps longer than the holder's remaining
// time (or 2 s). The other waiters of that process wait behind it. A
// release frees the row, then the doorbell. So the server wakes exactly one
// sleeper, which tries the row and keeps the doorbell with its grant. That
// is one statement on the lease table per waiter per handover, whatever the
// number of waiters. A holder that dies, is stopped or whose connection is
// killed strands nobody past its grant's expiry. Its key's handovers may
// then take up to 2 s each, until its session ends or it finds its grant
// lost. Waiters are not served in arrival order.
//
// The doorbell connections are bounded (Options.Bells, 8 by default); a
// waiter without one polls with backoff and full jitter, capped by the
// holder's remaining time. Named locks need MySQL 5.7+ or MariaDB 10.0.2+.
//
// Apart from the doorbells (session state on connections of their own),
// the driver relies on no session state. It uses no user variables, only
// autocommit statements, and break in one transaction. So a proxy that
// routes each transaction to any server connection cannot break a grant.
// (This is tested against PgBouncer for the PostgreSQL driver; no MySQL
// proxy is tested.) Behind such a proxy the doorbells may not ring: turn
// them off (Options.Bells < 0) and waiters poll.
package fencedmysql

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"github.com/fenced-dev/fenced/internal/core/limits"
	"io"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/backend/leasetable"
	"github.com/fenced-dev/fenced/internal/backend/sqlident"
	"github.com/fenced-dev/fenced/internal/backend/sqllease"
	"github.com/fenced-dev/fenced/internal/backend/urlquery"
	"github.com/fenced-dev/fenced/internal/core/storeurl"
)

func init() {
	fenced.Register("mysql", func(ctx context.Context, u *url.URL) (driver.Driver, error) { return open(ctx, u) },
		driver.Expiry{Name: "MySQL/MariaDB", Note: "expiry by the server's clock inside the statement, to the microsecond"})
}

const paramSocket = "socket"

// ErrSchema means the lease, audit or floor table exists with a shape
// other than the one the driver needs (from an older fenced or another
// tool). Nothing is changed when it is returned.
var ErrSchema = leasetable.ErrSchema

// Options configure New. The zero value (or nil) gives the defaults.
type Options struct {
	// Table is the lease table (default "fenced_leases").
	Table string
	// Bells bounds the connections the driver keeps for doorbells (see
	// "Waiting" in the package documentation): a waiter asleep on a
	// doorbell, or a grant holding one, takes one each. Zero means 8; a
	// negative value turns doorbells off, and waiters poll. A driver made
	// with New takes them from the *sql.DB it was given (they count
	// against its SetMaxOpenConns, of which they take at most half), one
	// opened by URL from a pool of its own.
	Bells int
}

// Driver is the MySQL/MariaDB lease-table driver. It implements
// driver.Driver, driver.TimedQueuer (waiting by doorbell),
// driver.BatchRenewer, driver.BreakLogger and driver.FenceFloorer. Its
// methods are safe for concurrent use.
type Driver struct {
	db    *sql.DB
	table string
	// t, b and f are the quoted names of the lease, audit and floor tables.
	t, b, f string
	std     *sqllease.StdDB
	bell    *doorbell
	*sqllease.Engine
}

// The engine implements driver.BatchRenewer, driver.BreakLogger and
// driver.FenceFloorer for every SQL backend; the
// doorbell driver.TimedQueuer.
var (
	_ driver.Driver       = (*Driver)(nil)
	_ driver.TimedQueuer  = (*Driver)(nil)
	_ driver.BatchRenewer = (*Driver)(nil)
)

// Open connects to the store named by a mysql:// URL (see the package
// documentation) and returns a driver that owns its *sql.DB. Errors match
// fenced.ErrInvalidURL (malformed URL or parameter) or
// fenced.ErrUnavailable (server unreachable, access denied); none contains
// the password.
func Open(ctx context.Context, rawURL string) (*Driver, error) {
	u, err := storeurl.Parse(rawURL)
	if err != nil {
		return nil, err
	}
	if u.Scheme != "mysql" {
		return nil, fmt.Errorf("%w: scheme %q, want mysql", fenced.ErrInvalidURL, u.Scheme)
	}
	d, err := open(ctx, u)
	if err != nil {
		return nil, fmt.Errorf("mysql: open %s: %w", storeurl.Redact(rawURL), err)
	}
	return d, nil
}

// Config converts a mysql:// URL to a go-sql-driver configuration and the
// lease table it names.
func Config(u *url.URL) (*mysql.Config, string, error) {
	if u.Opaque != "" || u.Host == "" {
		return nil, "", fmt.Errorf("%w: want mysql://user:password@host:port/database", fenced.ErrInvalidURL)
	}
	p, err := urlquery.Parse(u.RawQuery)
	if err != nil {
		return nil, "", err
	}
	table, err := leasetable.TakeTable(p)
	if err != nil {
		return nil, "", err
	}
	socket, viaSocket, err := p.Take(paramSocket)
	if err != nil {
		return nil, "", err
	}
	q := p.Rest()
	db := strings.TrimPrefix(u.Path, "/")
	if db == "" || strings.Contains(db, "/") {
		return nil, "", fmt.Errorf("%w: the path must name one database, as in mysql://host/dbname", fenced.ErrInvalidURL)
	}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "3306")
	}
	// Build a DSN for the parameters go-sql-driver knows, so that it
	// validates them; then set the connection fields directly, so that no
	// character of user, password or database needs DSN escaping.
	cfg, err := mysql.ParseDSN("/?" + q.Encode())
	if err != nil {
		return nil, "", fmt.Errorf("%w: %v", fenced.ErrInvalidURL, err)
	}
	cfg.User = u.User.Username()
	cfg.Passwd, _ = u.User.Password()
	cfg.Net, cfg.Addr = "tcp", addr
	if viaSocket {
		cfg.Net, cfg.Addr = "unix", socket
	}
	cfg.DBName = db
	if _, set := q["interpolateParams"]; !set {
		// Statements with arguments then take one round trip instead of
		// prepare + execute; the driver's hot statements are prepared
		// anyway.
		cfg.InterpolateParams = true
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 10 * time.Second
	}
	return cfg, table, nil
}

func open(ctx context.Context, u *url.URL) (*Driver, error) {
	cfg, table, err := Config(u)
	if err != nil {
		return nil, err
	}
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: %s", fenced.ErrInvalidURL, leasetable.Scrub(err.Error(), cfg.Passwd))
	}
	db := sql.OpenDB(connector)
	db.SetMaxIdleConns(8)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, connectError(cfg, err)
	}
	d, err := New(ctx, db, &Options{Table: table})
	if err != nil {
		db.Close()
		return nil, err
	}
	d.std.SetOwned()
	// Doorbell connections come from a pool of their own, so that
	// sleeping waiters never take the connections renewals need.
	bells := sql.OpenDB(connector)
	bells.SetMaxOpenConns(cap(d.bell.slots))
	bells.SetMaxIdleConns(cap(d.bell.slots))
	d.bell.pool, d.bell.ownPool = bells, true
	return d, nil
}

func connectError(cfg *mysql.Config, err error) error {
	var myErr *mysql.MySQLError
	if errors.As(err, &myErr) && (myErr.Number == 1193 || myErr.Number == 1231 || myErr.Number == 1232) {
		// go-sql-driver sets every parameter it does not know itself as a
		// system variable when it connects (so tabel=x reaches the
		// server): an unknown variable or a refused value is a usage
		// error, not an outage.
		return fmt.Errorf("%w: a URL parameter not fenced's (%s, %s) nor go-sql-driver's was refused as a system variable: %s (error %d)",
			fenced.ErrInvalidURL, leasetable.TableParam, paramSocket, leasetable.Scrub(myErr.Message, cfg.Passwd), myErr.Number)
	}
	if errors.As(err, &myErr) && (myErr.Number == 1045 || myErr.Number == 1044 || myErr.Number == 1698) {
		return fmt.Errorf("%w: access denied for user %q at %s: %s (error %d)",
			fenced.ErrUnavailable, cfg.User, cfg.Addr, leasetable.Scrub(myErr.Message, cfg.Passwd), myErr.Number)
	}
	return fmt.Errorf("%w: cannot connect to MySQL at %s: %s", fenced.ErrUnavailable, cfg.Addr, leasetable.Scrub(err.Error(), cfg.Passwd))
}

// New returns a driver over db, creating the lease and audit tables if
// missing. An existing table of another shape gives an error matching
// ErrSchema and changes nothing. Close does not close db. opts
// may be nil.
func New(ctx context.Context, db *sql.DB, opts *Options) (*Driver, error) {
	var name string
	bells := defaultBells
	if opts != nil {
		name = opts.Table
		switch {
		case opts.Bells < 0:
			bells = 0
		case opts.Bells > 0:
			bells = opts.Bells
		}
	}
	table, err := leasetable.TableOrDefault(name)
	if err != nil {
		return nil, fmt.Errorf("mysql: %w", err)
	}
	d := &Driver{db: db, table: table, t: quoteIdent(table), b: quoteIdent(table + leasetable.BreaksSuffix),
		f: quoteIdent(table + leasetable.FloorSuffix)}
	d.std = sqllease.NewStdDB(db, false)
	dialect := d.dialect()
	d.Engine = sqllease.New(dialect, d.std)
	if err := d.ensureSchema(ctx); err != nil {
		d.std.Close()
		return nil, err
	}
	var database string
	if err := db.QueryRowContext(ctx, `SELECT DATABASE()`).Scan(&database); err != nil {
		d.std.Close()
		return nil, d.Wrap("prepare", "", err)
	}
	d.bell = newDoorbell(d, db, database, bells)
	// The hot statements run prepared: one round trip each.
	if err := d.std.Prepare(ctx, d.acquireSQL(), dialect.Renew.SQL, dialect.Release.SQL, dialect.Inspect.SQL); err != nil {
		return nil, d.Wrap("prepare", "", err)
	}
	return d, nil
}

func quoteIdent(name string) string { return sqlident.QuoteMySQL(name) }

// freeExpiry is the expiry of a released or broken row: far in the past,
// so "expired" alone decides that a row can be granted, whatever the
// server's clock does later.
const freeExpiry = `'1970-01-01 00:00:00'`

// refusedMark is added to the remaining microseconds that a refused
// acquire reports through LAST_INSERT_ID; fences stay far below it.
const refusedMark = 1 << 62

const remainingExpr = `TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at)`

// acquireSQL is the one-statement grant. MySQL evaluates ON DUPLICATE KEY
// UPDATE assignments left to right, each seeing the columns already
// assigned. So the order matters. Owner is decided first, from the old
// expiry and owner. Fence then sees the old expiry and the new owner, which
// equals ours exactly when we are granted or already held it. expires_at
// last sees the new owner. A free row always has expires_at = freeExpiry, so
// "expired" covers "free". Parameters: key, owner, ttl, owner, owner, owner,
// owner, ttl.
//
// A grant's fence is one more than the larger of the row's counter and the
// table's fence floor (see FenceFloor); a new row starts at floor + 1. The
// VALUES row is evaluated first, so every grant takes a shared lock on the
// floor row before it touches a lease row. Prune takes the floor row
// exclusively before it deletes lease rows. So a grant either completes
// before a prune starts or reads the floor that prune raised, under any
// isolation level. A plain subquery would be a non-locking read under READ
// COMMITTED. It could miss a floor raised by a prune that deleted the very
// row the grant then inserts again.
func (d *Driver) acquireSQL() string {
	floor := `COALESCE((SELECT fence_floor FROM ` + d.f + ` WHERE id = 1 LOCK IN SHARE MODE), 0)`
	return `INSERT INTO ` + d.t + ` (lease_key, owner, fence, expires_at)
VALUES (?, ?, LAST_INSERT_ID(` + floor + ` + 1), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)
ON DUPLICATE KEY UPDATE
  owner = IF(expires_at <= UTC_TIMESTAMP(6) OR owner = ?, ?, owner),
  fence = IF(expires_at <= UTC_TIMESTAMP(6), LAST_INSERT_ID(GREATEST(fence, ` + floor + `) + 1),
          IF(owner = ?, LAST_INSERT_ID(fence),
             fence + 0 * LAST_INSERT_ID(` + fmt.Sprint(refusedMark) + ` + GREATEST(0, ` + remainingExpr + `)))),
  expires_at = IF(owner = ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, expires_at)`
}

// dialect is MySQL's part of the lease-table engine.
func (d *Driver) dialect() *sqllease.Dialect {
	acquire := d.acquireSQL()
	return &sqllease.Dialect{
		Name: "mysql",
		Unit: time.Microsecond,
		Statements: sqllease.Statements{
			Renew: sqllease.Stmt{
				SQL: `UPDATE ` + d.t + ` SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, fence = LAST_INSERT_ID(fence)
 WHERE lease_key = ? AND owner = ? AND fence = ? AND expires_at > UTC_TIMESTAMP(6)`,
				Args: func(a sqllease.Args) []any { return []any{a.TTL, a.Key, a.Owner, a.Fence} },
			},
			Release: sqllease.Stmt{SQL: `UPDATE ` + d.t + ` SET owner = '', expires_at = ` + freeExpiry +
				` WHERE lease_key = ? AND owner = ? AND fence = ?`},
			Inspect: sqllease.Stmt{SQL: `SELECT owner, fence, ` + remainingExpr + ` FROM ` + d.t + ` WHERE lease_key = ?`},
			// Keys are binary strings, sorted byte-wise; the prefix is
			// compared as bytes.
			List: sqllease.Stmt{
				SQL: `SELECT lease_key, owner, fence, ` + remainingExpr + ` FROM ` + d.t + `
 WHERE LEFT(lease_key, ?) = ? AND owner <> '' AND expires_at > UTC_TIMESTAMP(6) ORDER BY lease_key`,
				Args: func(a sqllease.Args) []any { return []any{len(a.Prefix), []byte(a.Prefix)} },
			},
			LockRow:  sqllease.Stmt{SQL: `SELECT owner, fence, ` + remainingExpr + ` FROM ` + d.t + ` WHERE lease_key = ? FOR UPDATE`},
			BreakRow: sqllease.Stmt{SQL: `UPDATE ` + d.t + ` SET owner = '', expires_at = ` + freeExpiry + ` WHERE lease_key = ?`},
			Audit: sqllease.Stmt{SQL: `INSERT INTO ` + d.b +
				` (broken_at, lease_key, fence, owner, reason, broken_by) VALUES (UTC_TIMESTAMP(6), ?, ?, ?, ?, ?)`},
			// broken_at travels as microseconds since the epoch, so the
			// result does not depend on the pool's parseTime or loc
			// settings.
			Breaks: sqllease.Stmt{
				SQL: `SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', broken_at), lease_key, fence, owner, reason, broken_by
  FROM ` + d.b + ` WHERE ? = '' OR lease_key = ? ORDER BY id`,
				Args: func(a sqllease.Args) []any { return []any{a.Key, a.Key} },
			},
			Floor: sqllease.Stmt{SQL: `SELECT COALESCE((SELECT fence_floor FROM ` + d.f + ` WHERE id = 1), 0), ` +
				`COALESCE((SELECT MAX(fence) FROM ` + d.t + `), 0)`},
			PruneCutoff: sqllease.Stmt{SQL: `SELECT CAST(UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND AS CHAR)`},
		},
		Acquire: func(ctx context.Context, c sqllease.Conn, key, owner string, us int64) (uint64, int64, error) {
			res, err := c.Exec(ctx, acquire, key, owner, us, owner, owner, owner, owner, us)
			if err != nil {
				return 0, 0, err
			}
			switch v := uint64(res.LastInsertID); {
			case v == 0:
				// Every path of the statement sets LAST_INSERT_ID to at
				// least 1.
				return 0, 0, errors.New("unexpected reply (no fence): is the table's shape what fenced created?")
			case v >= refusedMark:
				return 0, int64(v - refusedMark), nil
			default:
				return v, 0, nil
			}
		},
		// LAST_INSERT_ID(fence) runs only on the matched row; unlike the
		// affected-row count it does not depend on the clientFoundRows
		// setting or on whether the new expiry differs from the old.
		RenewedByInsertID: true,
		RenewBatch:        d.renewBatch,
		MaxBatch:          maxBatch,
		RaiseFloor:        d.raiseFloor,
		PruneBatch:        d.pruneBatch,
		Classify:          classify,
	}
}

// maxBatch bounds one batched renewal (4 placeholders per grant, MySQL
// allows 65535).
const maxBatch = 1000

// renewBatch is one UPDATE that renews every grant in reqs, then one
// SELECT that reads back which ones are held by their owner with the same
// fence and unexpired. A grant the UPDATE skipped because it had expired
// cannot look unexpired afterwards (only its owner could extend it, and a
// re-acquire after expiry raises the fence), so the read-back is exact.
func (d *Driver) renewBatch(ctx context.Context, c sqllease.Conn, reqs []sqllease.Renewal) ([]driver.Grant, error) {
	var rows, tuples []string
	var upd, sel []any
	for _, r := range reqs {
		rows = append(rows, "SELECT ? AS k, ? AS o, ? AS f, ? AS ttl")
		upd = append(upd, r.Grant.Key, r.Grant.Owner, r.Grant.Fence, r.TTL)
		tuples = append(tuples, "(?, ?, ?)")
		sel = append(sel, r.Grant.Key, r.Grant.Owner, r.Grant.Fence)
	}
	update := `UPDATE ` + d.t + ` l JOIN (` + strings.Join(rows, " UNION ALL ") + `) r
    ON l.lease_key = r.k AND l.owner = r.o AND l.fence = r.f
   SET l.expires_at = UTC_TIMESTAMP(6) + INTERVAL r.ttl MICROSECOND
 WHERE l.expires_at > UTC_TIMESTAMP(6)`
	if _, err := c.Exec(ctx, update, upd...); err != nil {
		return nil, err
	}
	q := `SELECT lease_key, owner, fence FROM ` + d.t + ` WHERE (lease_key, owner, fence) IN (` + strings.Join(tuples,
		", ") + `) AND expires_at > UTC_TIMESTAMP(6)`
	return sqllease.ScanGrants(c.Query(ctx, q, sel...))
}

// guarantees is what the backend promises, the part of Capabilities
// that says how far a lease can be trusted.
func (d *Driver) guarantees() driver.Capabilities {
	return driver.Capabilities{
		Fence:       fenced.FenceStrict,
		ServerClock: true,
		// UTC_TIMESTAMP is the server's wall clock.
		ClockStepSafe: false,
		Note: "fence is a counter on the InnoDB lease row " +
			"(durable with the row; after a failover only if replication was semi-synchronous or Galera); " +
			"expiry by the server's UTC_TIMESTAMP, its wall clock (not safe from clock steps); " + d.bell.note(),
	}
}

// Capabilities implements driver.Driver. It offers waiting by doorbell (a
// queue of the driver's own, not FIFO across processes) when the driver has
// doorbell connections, and the lease table's batch renewal, break log,
// fence floor and prune.
func (d *Driver) Capabilities() driver.Capabilities {
	c := d.guarantees()
	c.Queue, c.BatchRenew, c.BreakLog, c.FenceFloor = cap(d.bell.slots) > 0, true, true, true
	return c
}

// Close implements driver.Driver. It closes the driver's prepared
// statements and, for a driver opened by URL, its *sql.DB.
func (d *Driver) Close() error {
	first, err := d.Engine.Close()
	if first {
		d.bell.close()
	}
	return err
}

// The shapes the driver needs, in the terms readTable reports them. Keys
// and owners are binary strings: a character column would compare them by
// its collation, and MySQL's defaults (latin1_swedish_ci, utf8mb4_*_ci)
// take job:A for job:a and, with PAD SPACE, "job:a " for job:a.
var leaseShape, breakShape, floorShape = leasetable.ColumnTypes{
	Key: "varbinary", KeyBytes: limits.MaxKeyLen, Owner: "varbinary", OwnerBytes: maxOwnerLen,
	Fence: "bigint", Time: "datetime(6)", AuditID: "bigint", AuditIDAuto: true,
	AuditOwner: "varchar", AuditText: "text", FloorID: "tinyint",
}.Shapes()

// maxOwnerLen is the owner column's width: owner tokens are far shorter.
const maxOwnerLen = 255

// ensureSchema checks the shape of existing tables, then creates the
// missing ones (checking first, because MySQL commits each DDL statement
// on its own: nothing is created when an existing table is wrong). CREATE
// TABLE IF NOT EXISTS is safe when several processes start at once; the
// shape of a table created then (by this process or another) is checked
// after creating. Last, it makes sure the floor row exists.
func (d *Driver) ensureSchema(ctx context.Context) error {
	tables := []struct {
		name   string
		shape  leasetable.Shape
		create string
	}{
		{d.table, leaseShape, `CREATE TABLE IF NOT EXISTS ` + d.t + ` (
  lease_key  VARBINARY(256) NOT NULL PRIMARY KEY,
  owner      VARBINARY(255) NOT NULL,
  fence      BIGINT UNSIGNED NOT NULL,
  expires_at DATETIME(6) NOT NULL
) ENGINE=InnoDB`},
		{d.table + leasetable.BreaksSuffix, breakShape, `CREATE TABLE IF NOT EXISTS ` + d.b + ` (
  id         BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
  broken_at  DATETIME(6) NOT NULL,
  lease_key  VARBINARY(256) NOT NULL,
  fence      BIGINT UNSIGNED NOT NULL,
  owner      VARCHAR(64) NOT NULL,
  reason     TEXT NOT NULL,
  broken_by  TEXT NOT NULL,
  KEY (lease_key, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4`},
		{d.table + leasetable.FloorSuffix, floorShape, `CREATE TABLE IF NOT EXISTS ` + d.f + ` (
  id          TINYINT UNSIGNED NOT NULL PRIMARY KEY,
  fence_floor BIGINT UNSIGNED NOT NULL
) ENGINE=InnoDB`},
	}
	checked := map[string]bool{}
	for create := range 2 {
		for _, s := range tables {
			if checked[s.name] {
				continue
			}
			found, exists, err := d.readTable(ctx, s.name)
			if err != nil {
				return d.Wrap("prepare tables", s.name, err)
			}
			if !exists && create == 1 {
				if _, err := d.db.ExecContext(ctx, s.create); err != nil {
					return d.Wrap("create table", s.name, err)
				}
				if found, exists, err = d.readTable(ctx, s.name); err != nil {
					return d.Wrap("prepare tables", s.name, err)
				}
			}
			if exists {
				if err := leasetable.Check(s.name, s.shape, found); err != nil {
					return fmt.Errorf("mysql: %w", err)
				}
				checked[s.name] = true
			}
		}
	}
	if _, err := d.db.ExecContext(ctx, `INSERT INTO `+d.f+` (id, fence_floor) VALUES (1, 0) ON DUPLICATE KEY UPDATE id = id`); err != nil {
		return d.Wrap("prepare tables", d.table+leasetable.FloorSuffix, err)
	}
	return nil
}

// readTable reads table's shape from information_schema: its columns
// (datetime types with their precision, character columns with their
// collation), its unique indexes, and whether it is an InnoDB base table.
func (d *Driver) readTable(ctx context.Context, table string) (leasetable.Existing, bool, error) {
	found := leasetable.Existing{Columns: map[string]leasetable.ExistingColumn{}}
	var kind, engine sql.NullString
	err := d.db.QueryRowContext(ctx,
		`SELECT table_type, engine FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?`,
		table).Scan(&kind, &engine)
	if errors.Is(err, sql.ErrNoRows) {
		return found, false, nil
	}
	if err != nil {
		return found, false, err
	}
	if kind.String != "BASE TABLE" {
		found.Problems = append(found.Problems, fmt.Sprintf("it is a %s, not a table", strings.ToLower(kind.String)))
	} else if !strings.EqualFold(engine.String, "InnoDB") {
		found.Problems = append(found.Problems, fmt.Sprintf("its engine is %s, want InnoDB (row locks and transactions)", engine.String))
	}
	rows, err := d.db.QueryContext(ctx, `SELECT column_name, data_type, COALESCE(datetime_precision, -1),
  COALESCE(collation_name, ''), COALESCE(character_octet_length, 0), extra
  FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = ?`, table)
	if err != nil {
		return found, true, err
	}
	defer rows.Close()
	for rows.Next() {
		var name, typ, collation, extra string
		var precision, octets int64
		if err := rows.Scan(&name, &typ, &precision, &collation, &octets, &extra); err != nil {
			return found, true, err
		}
		c := leasetable.ExistingColumn{Type: strings.ToLower(typ), MaxBytes: octets,
			AutoIncrement: strings.Contains(strings.ToLower(extra), "auto_increment")}
		if precision >= 0 && (c.Type == "datetime" || c.Type == "timestamp" || c.Type == "time") {
			c.Type = fmt.Sprintf("%s(%d)", c.Type, precision)
		}
		c.Inexact = collationHazard(collation)
		found.Columns[strings.ToLower(name)] = c
	}
	if err := rows.Err(); err != nil {
		return found, true, err
	}
	rows.Close()
	ix, err := d.db.QueryContext(ctx, `SELECT index_name, column_name, sub_part FROM information_schema.statistics
 WHERE table_schema = DATABASE() AND table_name = ? AND non_unique = 0 ORDER BY index_name, seq_in_index`, table)
	if err != nil {
		return found, true, err
	}
	defer ix.Close()
	for ix.Next() {
		var name string
		var col sql.NullString
		var prefix sql.NullInt64
		if err := ix.Scan(&name, &col, &prefix); err != nil {
			return found, true, err
		}
		n := len(found.Unique)
		if n == 0 || found.Unique[n-1].Name != name {
			found.Unique = append(found.Unique, leasetable.UniqueIndex{Name: name})
			n++
		}
		u := &found.Unique[n-1]
		u.Columns = append(u.Columns, strings.ToLower(col.String))
		if prefix.Valid {
			u.Defect = fmt.Sprintf("covers only the first %d bytes of %s", prefix.Int64, col.String)
		}
	}
	return found, true, ix.Err()
}

// collationHazard describes how a character column's collation can take
// different strings for equal; "" for a binary column.
func collationHazard(collation string) string {
	if collation == "" {
		return ""
	}
	c := strings.ToLower(collation)
	var how []string
	if strings.Contains(c, "_ci") || strings.Contains(c, "_ai") {
		how = append(how, "compares case-insensitively")
	}
	if !strings.Contains(c, "nopad") && !strings.Contains(c, "_0900_") {
		how = append(how, "ignores trailing spaces")
	}
	if len(how) == 0 {
		how = append(how, "compares by character, not byte")
	}
	return "collation " + collation + ", which " + strings.Join(how, " and ")
}

// classify names the sentinel a MySQL error matches (see
// sqllease.Dialect.Classify).
func classify(err error) error {
	var myErr *mysql.MySQLError
	if errors.As(err, &myErr) {
		switch myErr.Number {
		case 1040, 1044, 1045, 1053, 1205, 1213, 1698, 1927:
			// Too many connections, access denied, shutdown, lock wait
			// timeout, deadlock, connection killed: the statement was not
			// applied.
			return fenced.ErrUnavailable
		}
		return nil
	}
	var opErr *net.OpError
	if errors.Is(err, sqldriver.ErrBadConn) || (errors.As(err, &opErr) && opErr.Op == "dial") {
		return fenced.ErrUnavailable
	}
	var netErr net.Error
	if errors.Is(err, mysql.ErrInvalidConn) || errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, sql.ErrConnDone) {
		return fenced.ErrUnknownOutcome
	}
	return nil
}
