// Package sqlite is fenced's embedded default backend: a lease table in a
// SQLite file, shared safely by the processes of one host.
//
// It is pure Go (modernc.org/sqlite, no cgo). The file is opened in WAL
// mode with a busy timeout and full synchronous commits, so concurrent
// processes serialize on SQLite's write lock and a fence, once returned, has
// reached the disk. Each key is one row whose fence column is the counter:
// a grant is one INSERT … ON CONFLICT DO UPDATE … RETURNING statement that
// succeeds only if the key is free or expired and returns the new fence.
// Expiry is decided inside the statement by SQLite's clock, which for an
// embedded database is the host's clock: every process on the host reads
// the same one. Rows are never deleted, so the counter survives release,
// expiry, break and restart.
//
// URL forms:
//
//	sqlite:                         the default file (see DefaultPath)
//	sqlite:///var/lib/app/leases.db an absolute path
//	sqlite:relative/leases.db       a path relative to the working directory
//
// Beside the file, FILE.lock serializes the first open of a new file by
// several processes (creating it, switching it to WAL, creating tables).
//
// Query parameters: table (default fenced_leases; the break log is
// TABLE_breaks), busy_timeout (default 5s).
//
// Availability caveat of one shared file: a process stopped in the middle
// of a write (SIGSTOP, a debugger, a frozen VM) keeps SQLite's write lock
// until it runs again or dies (a killed process's locks go with it), and
// every other process waits up to busy_timeout, then fails with
// ErrUnavailable. Safety is unaffected: nothing is granted twice.
//
// SQLite cannot notify another process. Waiters instead detect commits by
// any process through PRAGMA data_version (a cheap read on one connection
// per driver, every 2ms while somebody waits) and retry only when their key
// is free; a grant that expires without a release is caught by the
// client's timer at the holder's expiry.
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/leasetable"
)

func init() {
	fenced.Register("sqlite", openURL)
}

// DefaultTable is the lease table's default name.
const DefaultTable = leasetable.DefaultTable

// DefaultPath returns the default lease file:
// $XDG_STATE_HOME/fenced/fenced.db, or ~/.local/state/fenced/fenced.db.
func DefaultPath() (string, error) {
	if d := os.Getenv("XDG_STATE_HOME"); d != "" && filepath.IsAbs(d) {
		return filepath.Join(d, "fenced", "fenced.db"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("sqlite: no default lease file: %w", err)
	}
	return filepath.Join(home, ".local", "state", "fenced", "fenced.db"), nil
}

// Options configure a driver. The zero value gives the defaults.
type Options struct {
	// Table is the lease table. Default DefaultTable.
	Table string
	// BusyTimeout is how long a statement waits for another process's
	// write lock before failing with ErrUnavailable. Default 5s.
	BusyTimeout time.Duration
}

func openURL(ctx context.Context, u *url.URL) (driver.Driver, error) {
	if u.Host != "" {
		return nil, fmt.Errorf("%w: sqlite URL has a host %q; use sqlite:///absolute/path.db or sqlite:relative/path.db", driver.ErrInvalidURL, u.Host)
	}
	path := u.Opaque
	if path == "" {
		path = u.Path
	}
	if path == "" {
		p, err := DefaultPath()
		if err != nil {
			return nil, err
		}
		path = p
	} else if p, err := url.PathUnescape(path); err == nil {
		path = p
	}
	var opts Options
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("%w: query %q: %v", driver.ErrInvalidURL, u.RawQuery, err)
	}
	for k := range q {
		switch k {
		case "table":
			opts.Table = q.Get(k)
		case "busy_timeout":
			d, err := time.ParseDuration(q.Get(k))
			if err != nil || d < 0 {
				return nil, fmt.Errorf("%w: busy_timeout %q is not a duration such as 5s", driver.ErrInvalidURL, q.Get(k))
			}
			opts.BusyTimeout = d
		default:
			return nil, fmt.Errorf("%w: unknown sqlite URL parameter %q (known: table, busy_timeout)", driver.ErrInvalidURL, k)
		}
	}
	if opts.Table != "" {
		if err := leasetable.ValidateTable(opts.Table); err != nil {
			return nil, err
		}
	}
	return OpenFile(ctx, path, &opts)
}

// OpenFile opens (creating if needed) the lease file at path, and its
// parent directory. opts may be nil.
func OpenFile(ctx context.Context, path string, opts *Options) (*Driver, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.BusyTimeout == 0 {
		o.BusyTimeout = 5 * time.Second
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("sqlite: %w: %v", driver.ErrUnavailable, err)
	}
	dsn := "file:" + (&url.URL{Path: path}).EscapedPath() + "?" + url.Values{
		"_pragma": {
			fmt.Sprintf("busy_timeout(%d)", o.BusyTimeout.Milliseconds()),
			"journal_mode(WAL)",
			"synchronous(FULL)",
		},
		"_txlock": {"immediate"},
	}.Encode()
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w: %v", path, driver.ErrUnavailable, err)
	}
	// Processes opening a new file at the same moment race on switching it
	// to WAL and creating the tables (SQLite answers some of those steps
	// with SQLITE_BUSY or I/O errors without waiting), so the first
	// connection and the migration happen under an exclusive lock on a
	// file beside the database.
	unlock, err := lockInit(ctx, path+".lock", o.BusyTimeout)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("sqlite: %s: %w", path, err)
	}
	d, err := New(ctx, db, &o)
	unlock()
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("sqlite: %s: %w", path, err)
	}
	d.ownsDB = true
	return d, nil
}

// lockInit takes an exclusive flock on lockPath, waiting up to timeout.
// Where the lock file cannot be created (a read-only directory) it returns
// without locking: such a file is not being created by anyone either.
func lockInit(ctx context.Context, lockPath string, timeout time.Duration) (unlock func(), err error) {
	f, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return func() {}, nil
	}
	deadline := time.Now().Add(timeout)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() {
				syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
				f.Close()
			}, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) || time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("%w: another process holds %s: %v", driver.ErrUnavailable, lockPath, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Driver is the SQLite lease driver. It implements driver.Driver,
// driver.BatchRenewer, driver.BreakLogger and driver.Notifier (by change
// detection: see Subscribe).
type Driver struct {
	db     *sql.DB
	ownsDB bool
	table  string
	q      queries
	watch  watcher
}

var (
	_ driver.Driver       = (*Driver)(nil)
	_ driver.BatchRenewer = (*Driver)(nil)
	_ driver.BreakLogger  = (*Driver)(nil)
	_ driver.Notifier     = (*Driver)(nil)
)

// New returns a driver over an open SQLite database, creating the lease and
// break tables if missing. The caller keeps ownership of db (Close does not
// close it); it should have been opened with a busy timeout. opts may be
// nil. A table that exists with another shape is an error.
func New(ctx context.Context, db *sql.DB, opts *Options) (*Driver, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Table == "" {
		o.Table = DefaultTable
	}
	if err := leasetable.ValidateTable(o.Table); err != nil {
		return nil, err
	}
	d := &Driver{db: db, table: o.Table, q: newQueries(o.Table)}
	if err := d.migrate(ctx); err != nil {
		return nil, err
	}
	return d, nil
}

// now is SQLite's clock in Unix milliseconds, stable within one statement.
const now = `CAST(unixepoch('subsec') * 1000 AS INTEGER)`

type queries struct {
	acquire, heldFor, renew, release, inspect, list, breakLease, logBreak, breaks string
}

func newQueries(t string) queries {
	r := strings.NewReplacer("T_", t, "NOW", now)
	return queries{
		acquire: r.Replace(`INSERT INTO T_ (key, owner, fence, expires_ms, granted_ms)
VALUES (?1, ?2, 1, NOW + ?3, NOW)
ON CONFLICT (key) DO UPDATE SET
  fence = CASE WHEN T_.owner = excluded.owner AND T_.expires_ms > NOW THEN T_.fence ELSE T_.fence + 1 END,
  granted_ms = CASE WHEN T_.owner = excluded.owner AND T_.expires_ms > NOW THEN T_.granted_ms ELSE excluded.granted_ms END,
  owner = excluded.owner,
  expires_ms = excluded.expires_ms
WHERE T_.owner IS NULL OR T_.expires_ms <= NOW OR T_.owner = excluded.owner
RETURNING fence`),
		heldFor: r.Replace(`SELECT expires_ms - NOW FROM T_ WHERE key = ?1`),
		renew:   r.Replace(`UPDATE T_ SET expires_ms = NOW + ?4 WHERE key = ?1 AND owner = ?2 AND fence = ?3 AND expires_ms > NOW`),
		release: r.Replace(`UPDATE T_ SET owner = NULL, expires_ms = 0 WHERE key = ?1 AND owner = ?2 AND fence = ?3`),
		inspect: r.Replace(`SELECT key, owner, fence, expires_ms - NOW FROM T_ WHERE key = ?1`),
		list: r.Replace(`SELECT key, owner, fence, expires_ms - NOW FROM T_
WHERE substr(key, 1, length(?1)) = ?1 AND owner IS NOT NULL AND expires_ms > NOW ORDER BY key`),
		breakLease: r.Replace(`UPDATE T_ SET owner = NULL, expires_ms = 0
WHERE key = ?1 AND owner IS NOT NULL AND expires_ms > NOW
RETURNING fence, NOW`),
		logBreak: r.Replace(`INSERT INTO T__breaks (key, fence, owner, reason, by_whom, at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)`),
		breaks:   r.Replace(`SELECT at_ms * 1000, key, fence, owner, reason, by_whom FROM T__breaks WHERE ?1 = '' OR key = ?1 ORDER BY id`),
	}
}

// The shapes the driver needs, with the declared types pragma_table_info
// reports.
var (
	leaseColumns = []leasetable.Column{{Name: "key", Type: "text"}, {Name: "owner", Type: "text"}, {Name: "fence", Type: "integer"},
		{Name: "expires_ms", Type: "integer"}, {Name: "granted_ms", Type: "integer"}}
	breakColumns = []leasetable.Column{{Name: "id", Type: "integer"}, {Name: "key", Type: "text"}, {Name: "fence", Type: "integer"},
		{Name: "owner", Type: "text"}, {Name: "reason", Type: "text"}, {Name: "by_whom", Type: "text"}, {Name: "at_ms", Type: "integer"}}
)

func (d *Driver) migrate(ctx context.Context) error {
	t := d.table
	stmts := []string{
		`CREATE TABLE IF NOT EXISTS ` + t + ` (
  key TEXT PRIMARY KEY NOT NULL,
  owner TEXT,
  fence INTEGER NOT NULL CHECK (fence > 0),
  expires_ms INTEGER NOT NULL,
  granted_ms INTEGER NOT NULL
) WITHOUT ROWID`,
		`CREATE TABLE IF NOT EXISTS ` + t + `_breaks (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  key TEXT NOT NULL,
  fence INTEGER NOT NULL,
  owner TEXT NOT NULL,
  reason TEXT NOT NULL,
  by_whom TEXT NOT NULL,
  at_ms INTEGER NOT NULL
)`,
	}
	for _, s := range stmts {
		if _, err := d.db.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("create lease tables: %w", classify(err))
		}
	}
	if err := d.checkColumns(ctx, t, leaseColumns); err != nil {
		return err
	}
	return d.checkColumns(ctx, t+"_breaks", breakColumns)
}

// checkColumns fails clearly (with leasetable.ErrSchema) when a table of
// ours exists in another shape.
func (d *Driver) checkColumns(ctx context.Context, table string, want []leasetable.Column) error {
	rows, err := d.db.QueryContext(ctx, `SELECT name, type FROM pragma_table_info(?1)`, table)
	if err != nil {
		return classify(err)
	}
	defer rows.Close()
	have := map[string]string{}
	for rows.Next() {
		var n, typ string
		if err := rows.Scan(&n, &typ); err != nil {
			return classify(err)
		}
		have[n] = strings.ToLower(typ)
	}
	if err := rows.Err(); err != nil {
		return classify(err)
	}
	return leasetable.CheckShape(table, want, have, true)
}

// classify maps SQLite errors to fenced's sentinels: a busy or locked
// database and I/O failures mean nothing was applied.
func classify(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	var se *sqlite.Error
	if errors.As(err, &se) {
		switch se.Code() & 0xff {
		case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_FULL, sqlite3.SQLITE_READONLY:
			return fmt.Errorf("%w: %v", driver.ErrUnavailable, err)
		}
	}
	if errors.Is(err, sql.ErrConnDone) {
		return fmt.Errorf("%w: %v", driver.ErrClosed, err)
	}
	return err
}

// TryAcquire implements driver.Driver in one statement.
func (d *Driver) TryAcquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	var fence int64
	err := d.db.QueryRowContext(ctx, d.q.acquire, key, owner, ttl.Milliseconds()).Scan(&fence)
	if errors.Is(err, sql.ErrNoRows) {
		held := &driver.HeldError{Key: key}
		var left int64
		if d.db.QueryRowContext(ctx, d.q.heldFor, key).Scan(&left) == nil && left > 0 {
			held.Remaining = time.Duration(left) * time.Millisecond
		}
		return 0, held
	}
	if err != nil {
		return 0, classify(err)
	}
	return uint64(fence), nil
}

// Renew implements driver.Driver.
func (d *Driver) Renew(ctx context.Context, g driver.Grant, ttl time.Duration) error {
	res, err := d.db.ExecContext(ctx, d.q.renew, g.Key, g.Owner, int64(g.Fence), ttl.Milliseconds())
	return affected(res, err, g)
}

// Release implements driver.Driver.
func (d *Driver) Release(ctx context.Context, g driver.Grant) error {
	res, err := d.db.ExecContext(ctx, d.q.release, g.Key, g.Owner, int64(g.Fence))
	return affected(res, err, g)
}

func affected(res sql.Result, err error, g driver.Grant) error {
	if err != nil {
		return classify(err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return classify(err)
	}
	if n == 0 {
		return fmt.Errorf("%s fence %d: %w", g.Key, g.Fence, driver.ErrNotHeld)
	}
	return nil
}

// RenewBatch implements driver.BatchRenewer with one statement for the
// whole batch.
func (d *Driver) RenewBatch(ctx context.Context, reqs []driver.RenewRequest) ([]error, error) {
	if len(reqs) == 0 {
		return nil, nil
	}
	var b strings.Builder
	args := make([]any, 0, 4*len(reqs))
	b.WriteString("WITH r(k, o, f, ttl) AS (VALUES ")
	for i, r := range reqs {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(?, ?, ?, ?)")
		args = append(args, r.Grant.Key, r.Grant.Owner, int64(r.Grant.Fence), r.TTL.Milliseconds())
	}
	b.WriteString(") UPDATE " + d.table + " SET expires_ms = " + now + " + r.ttl FROM r WHERE " +
		d.table + ".key = r.k AND " + d.table + ".owner = r.o AND " + d.table + ".fence = r.f AND " +
		d.table + ".expires_ms > " + now + " RETURNING " + d.table + ".key, " + d.table + ".fence")
	rows, err := d.db.QueryContext(ctx, b.String(), args...)
	if err != nil {
		return nil, classify(err)
	}
	defer rows.Close()
	renewed := map[driver.Grant]bool{}
	for rows.Next() {
		var k string
		var f int64
		if err := rows.Scan(&k, &f); err != nil {
			return nil, classify(err)
		}
		renewed[driver.Grant{Key: k, Fence: uint64(f)}] = true
	}
	if err := rows.Err(); err != nil {
		return nil, classify(err)
	}
	errs := make([]error, len(reqs))
	for i, r := range reqs {
		if !renewed[driver.Grant{Key: r.Grant.Key, Fence: r.Grant.Fence}] {
			errs[i] = fmt.Errorf("%s fence %d: %w", r.Grant.Key, r.Grant.Fence, driver.ErrNotHeld)
		}
	}
	return errs, nil
}

func scanInfo(sc interface{ Scan(...any) error }) (driver.LeaseInfo, error) {
	var info driver.LeaseInfo
	var owner sql.NullString
	var fence, left int64
	if err := sc.Scan(&info.Key, &owner, &fence, &left); err != nil {
		return info, err
	}
	info.Fence = uint64(fence)
	if owner.Valid && left > 0 {
		info.Held = true
		info.SetOwner(owner.String)
		info.Remaining = time.Duration(left) * time.Millisecond
	}
	return info, nil
}

// Inspect implements driver.Driver.
func (d *Driver) Inspect(ctx context.Context, key string) (driver.LeaseInfo, error) {
	info, err := scanInfo(d.db.QueryRowContext(ctx, d.q.inspect, key))
	if errors.Is(err, sql.ErrNoRows) {
		return driver.LeaseInfo{Key: key}, driver.ErrNotFound
	}
	return info, classify(err)
}

// List implements driver.Driver.
func (d *Driver) List(ctx context.Context, prefix string) ([]driver.LeaseInfo, error) {
	rows, err := d.db.QueryContext(ctx, d.q.list, prefix)
	if err != nil {
		return nil, classify(err)
	}
	defer rows.Close()
	var out []driver.LeaseInfo
	for rows.Next() {
		info, err := scanInfo(rows)
		if err != nil {
			return nil, classify(err)
		}
		out = append(out, info)
	}
	return out, classify(rows.Err())
}

// Break implements driver.Driver: in one transaction it frees the key and
// records the break in TABLE_breaks.
func (d *Driver) Break(ctx context.Context, key string, req driver.BreakRequest) (driver.LeaseInfo, error) {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return driver.LeaseInfo{}, classify(err)
	}
	defer tx.Rollback()
	var info driver.LeaseInfo
	var inspectLeft int64
	var owner sql.NullString
	var fence int64
	if err := tx.QueryRowContext(ctx, d.q.inspect, key).Scan(&info.Key, &owner, &fence, &inspectLeft); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return driver.LeaseInfo{Key: key}, fmt.Errorf("%s: %w", key, driver.ErrNotHeld)
		}
		return info, classify(err)
	}
	var nowMS int64
	err = tx.QueryRowContext(ctx, d.q.breakLease, key).Scan(&fence, &nowMS)
	if errors.Is(err, sql.ErrNoRows) {
		return driver.LeaseInfo{Key: key, Fence: uint64(fence)}, fmt.Errorf("%s: %w", key, driver.ErrNotHeld)
	}
	if err != nil {
		return info, classify(err)
	}
	info = driver.LeaseInfo{Key: key, Held: true, Fence: uint64(fence), Remaining: time.Duration(inspectLeft) * time.Millisecond}
	info.SetOwner(owner.String)
	if _, err := tx.ExecContext(ctx, d.q.logBreak, key, fence, info.Owner, req.Reason, req.By, nowMS); err != nil {
		return driver.LeaseInfo{}, classify(err)
	}
	if err := tx.Commit(); err != nil {
		return driver.LeaseInfo{}, classify(err)
	}
	return info, nil
}

// Breaks implements driver.BreakLogger.
func (d *Driver) Breaks(ctx context.Context, key string) ([]driver.BreakRecord, error) {
	rows, err := d.db.QueryContext(ctx, d.q.breaks, key)
	if err != nil {
		return nil, classify(err)
	}
	defer rows.Close()
	out, err := leasetable.ScanBreaks(rows)
	return out, classify(err)
}

// Guarantees implements driver.Driver.
func (d *Driver) Guarantees() driver.Guarantees {
	return driver.Guarantees{
		Fence:       driver.FenceStrict,
		ServerClock: true,
		// unixepoch() inside the statement reads the host's wall clock.
		ClockStepSafe: false,
		Note:          "one host: the fence counter is a row in the file and survives restarts; expiry uses the host's wall clock inside the statement (not safe from clock steps); waiters detect commits by other processes (PRAGMA data_version every 2ms) and retry only when their key is free",
	}
}

// Close implements driver.Driver. It closes the database only if the
// driver opened it.
func (d *Driver) Close() error {
	d.watch.mu.Lock()
	if d.watch.stop != nil {
		d.watch.stop()
		d.watch.stop = nil
	}
	done := d.watch.done
	d.watch.mu.Unlock()
	if done != nil {
		<-done
	}
	if d.ownsDB {
		return d.db.Close()
	}
	return nil
}

// DB returns the underlying database, for guards that keep the protected
// resource in the same file.
func (d *Driver) DB() *sql.DB { return d.db }
