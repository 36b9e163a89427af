// Package fencedsqlite is fenced's embedded default backend: a lease table in a
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
// the same one. Release, expiry and break keep the row, so the counter
// survives them and restarts.
//
// The table TABLE_floor holds the fence floor: a grant's fence is one more
// than the larger of the row's counter and the floor (a new row starts at
// floor + 1). RaiseFenceFloor raises it, for keys moved here from another
// table or store (fenced floor raise). Prune (fenced prune) deletes the rows
// of keys unused for a given time. A released or broken key counts as unused
// since long ago: the row keeps no release time. In the same transaction,
// under SQLite's write lock, it raises the floor to the highest fence it
// deleted. So a key granted again starts above its old fences.
//
// An existing table is checked before anything is created, in the same
// transaction. It is refused with ErrSchema, and nothing changes, if its key
// has no unique index of its own, or if its columns are retyped. So is one
// whose key or owner column compares case-insensitively or ignores trailing
// spaces (COLLATE NOCASE, RTRIM).
//
// URL forms:
//
//	sqlite:                         the default file (see DefaultPath)
//	sqlite:///var/lib/app/leases.db an absolute path
//	sqlite:relative/leases.db       a path relative to the working directory
//
// Beside the file, FILE.lock serializes the first open of a new file by
// several processes (creating it, switching it to WAL, creating tables),
// FILE.wake is the shared doorbell and FILE.waiters the directory of the
// waiting processes' own doorbells (see below). fenced opens none of them
// through a symbolic link and never opens a FIFO or a device: one found
// there is refused with ErrForeignFile, naming it.
//
// Query parameters: table (default fenced_leases), busy_timeout (default 5s)
// and create=1. The break log is TABLE_breaks, the fence floor TABLE_floor,
// the waiter queue TABLE_waiters.
// create=1 creates the file's directory if it is missing. Without it, a path
// whose directory does not exist is most likely mistyped: it is refused,
// matching ErrNoDir and fenced.ErrInvalidURL. The default file's directory
// is always created. Any other parameter is refused.
//
// Availability caveat of one shared file: a process stopped in the middle of
// a write (SIGSTOP, a debugger, a frozen VM) keeps SQLite's write lock until
// it runs again or dies. A killed process's locks go with it. Every other
// process waits up to busy_timeout, then fails with ErrUnavailable. Safety
// is unaffected: nothing is granted twice.
//
// SQLite cannot notify another process. Instead a process with waiters for
// a key stands in the key's waiter queue (the table TABLE_waiters), with a
// doorbell file of its own in the directory FILE.waiters that only it
// watches (inotify). Each commit that may free a key (release, break) opens
// the doorbell of the process that has waited longest, once the commit is
// durable and visible, and takes it off the queue: one process wakes per
// release, however many wait, and its waiter tries at once. A refused
// waiter stands again at the end. A process that died is found by its
// doorbell's flock, which went with it, and skipped. A rung process
// acknowledges the ring; one that does not within about 25 ms (stopped:
// SIGSTOP, a debugger) has its turn passed on to the next. An idle waiter
// costs nothing. Every such commit also opens the shared doorbell
// FILE.wake, for observers (which see every release) and for processes
// that cannot make a doorbell of their own; those confirm a change with
// PRAGMA data_version and read the keys they wait for. Without inotify the driver reads
// data_version every 2ms while somebody waits. A grant that expires
// without a release, or a key freed by another program, is caught by the
// client's fallback timer.
package fencedsqlite

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"io"
	"io/fs"
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
	"github.com/fenced-dev/fenced/internal/backend/leasetable"
	"github.com/fenced-dev/fenced/internal/backend/sqlident"
	"github.com/fenced-dev/fenced/internal/backend/sqllease"
	"github.com/fenced-dev/fenced/internal/backend/urlquery"
)

func init() {
	fenced.Register("sqlite", openURL, driver.Expiry{Name: "SQLite",
		Note: "expiry in milliseconds by the host's clock inside the statement"})
}

// DefaultTable is the lease table's default name.
const DefaultTable = leasetable.DefaultTable

// ErrSchema means the lease, audit or floor table exists with a shape other
// than the one the driver needs (from an older fenced or another tool).
// Nothing is changed when it is returned.
var ErrSchema = leasetable.ErrSchema

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
	// write lock before failing with ErrUnavailable. Default 5s. An open
	// of a file not set up yet waits three times as long for the process
	// setting it up (ErrBusy).
	BusyTimeout time.Duration
	// CreateDir creates the file's directory (and its parents) when it
	// is missing. Without it OpenFile refuses a file in a directory that
	// does not exist (ErrNoDir): a mistyped path would otherwise give a
	// new, empty lease file that excludes nobody. The file itself is
	// created either way.
	CreateDir bool
}

// ErrNoDir means the lease file's directory does not exist and the driver
// was not asked to create it (?create=1, Options.CreateDir). Through a URL
// the error also matches fenced.ErrInvalidURL.
var ErrNoDir = errors.New("the lease file's directory does not exist")

// ErrBusy means opening the lease file waited for another process, alive
// and holding the file's locks, and gave up: three times
// Options.BusyTimeout for one setting a new file up, BusyTimeout for one
// writing. It also matches
// fenced.ErrUnavailable. Unlike the other errors of an open, it may pass
// by itself: processes that start together on a loaded machine open the
// file one after the other, so a caller that can wait (a follower
// standing for election, say) may open again.
var ErrBusy = errors.New("the lease file is busy")

func openURL(ctx context.Context, u *url.URL) (driver.Driver, error) {
	if u.Host != "" {
		return nil, fmt.Errorf("%w: sqlite URL has a host %q; use sqlite:///absolute/path.db or sqlite:relative/path.db",
			fenced.ErrInvalidURL, u.Host)
	}
	path := u.Opaque
	if path == "" {
		path = u.Path
	}
	var opts Options
	if path == "" {
		p, err := DefaultPath()
		if err != nil {
			return nil, err
		}
		// The default file is fenced's own: its directory is made.
		path, opts.CreateDir = p, true
	} else if p, err := url.PathUnescape(path); err == nil {
		path = p
	}
	p, err := urlquery.Parse(u.RawQuery)
	if err != nil {
		return nil, err
	}
	create, _, err := p.TakeBool("create")
	if err != nil {
		return nil, err
	}
	opts.CreateDir = opts.CreateDir || create
	if opts.Table, err = leasetable.TakeTable(p); err != nil {
		return nil, err
	}
	busy, ok, err := p.Take("busy_timeout")
	if err != nil {
		return nil, err
	}
	if ok {
		d, err := time.ParseDuration(busy)
		if err != nil || d < 0 {
			return nil, fmt.Errorf("%w: busy_timeout %q is not a duration such as 5s", fenced.ErrInvalidURL, busy)
		}
		opts.BusyTimeout = d
	}
	if err := p.NoRest(leasetable.TableParam, "busy_timeout", "create"); err != nil {
		return nil, err
	}
	d, err := OpenFile(ctx, path, &opts)
	if errors.Is(err, ErrNoDir) {
		return nil, fmt.Errorf("%w: %w", fenced.ErrInvalidURL, err)
	}
	return d, err
}

// OpenFile opens (creating if needed) the lease file at path. Its
// directory must exist unless opts.CreateDir is set (else ErrNoDir).
// opts may be nil.
func OpenFile(ctx context.Context, path string, opts *Options) (*Driver, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.BusyTimeout == 0 {
		o.BusyTimeout = 5 * time.Second
	}
	dir := filepath.Dir(path)
	if o.CreateDir {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("sqlite: %w: %v", fenced.ErrUnavailable, err)
		}
	} else if fi, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("sqlite: lease file %s: %w: %s (check the path; add ?create=1 to the URL to create it)", path, ErrNoDir, dir)
	} else if err == nil && !fi.IsDir() {
		return nil, fmt.Errorf("sqlite: lease file %s: %w: %s is not a directory", path, ErrNoDir, dir)
	}
	db, err := sql.Open("sqlite", dsn(path, o.BusyTimeout, "FULL"))
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w: %v", path, fenced.ErrUnavailable, err)
	}
	// Processes opening a new file at the same moment race on switching it
	// to WAL and creating the tables (SQLite answers some of those steps
	// with SQLITE_BUSY or I/O errors without waiting), so the first
	// connection and the migration happen under an exclusive lock on a
	// file beside the database. A file already set up needs neither: its
	// opens do not queue behind each other's waits for the write lock.
	unlock := func() {}
	table, tableErr := leasetable.TableOrDefault(o.Table)
	ready := tableErr == nil && inWAL(path) && tablesReady(ctx, db, table)
	if !ready {
		if unlock, err = lockInit(ctx, path+".lock", initLockWait*o.BusyTimeout); err != nil {
			db.Close()
			return nil, fmt.Errorf("sqlite: %s: %w", path, err)
		}
		// Another process may have set it up while this one waited: then
		// the lock goes at once, as for a file found set up above, not
		// after this open's own set-up. Six processes opening a new file
		// each held it through theirs in turn, and on a busy machine (CI)
		// the last waited past the busy timeout.
		if ready = tableErr == nil && inWAL(path) && tablesReady(ctx, db, table); ready {
			unlock()
			unlock = func() {}
		}
	}
	d, err := newDriver(ctx, db, &o, ready)
	unlock()
	if err != nil {
		db.Close()
		if busy(err) {
			return nil, fmt.Errorf("sqlite: %s: %w: %w", path, ErrBusy, err)
		}
		return nil, fmt.Errorf("sqlite: %s: %w", path, err)
	}
	d.std.SetOwned()
	// The waiter queue's writes need no fsync (see queue.go).
	if qdb, err := sql.Open("sqlite", dsn(path, o.BusyTimeout, "NORMAL")); err == nil {
		d.queue.db, d.queue.own = qdb, true
	}
	return d, nil
}

// dsn is the data source name of the file at path for modernc.org/sqlite:
// WAL, the busy timeout, the given synchronous level, and transactions
// begun IMMEDIATE.
func dsn(path string, busy time.Duration, synchronous string) string {
	return "file:" + (&url.URL{Path: path}).EscapedPath() + "?" + url.Values{
		"_pragma": {
			fmt.Sprintf("busy_timeout(%d)", busy.Milliseconds()),
			"journal_mode(WAL)",
			"synchronous(" + synchronous + ")",
		},
		"_txlock": {"immediate"},
	}.Encode()
}

// initLockWait is how many busy timeouts an open waits for the process
// setting a new file up (its flock on FILE.lock). That process is alive (a
// dead one's flock is gone with it). It may wait the busy timeout twice
// for SQLite's write lock, for the WAL switch and for the tables, then
// writes them; under load (scripts/hog.sh) a set-up with no rival at
// SQLite held the lock over 5 s, and five opens gave up after one.
const initLockWait = 3

// lockInit takes an exclusive flock on lockPath, waiting up to timeout
// (initLockWait busy timeouts), then failing with ErrBusy.
// Where the lock file cannot be created (a read-only directory) it returns
// without locking: such a file is not being created by anyone either.
// Something other than a regular file there is refused (ErrForeignFile,
// see openBeside). A lock file this process may not write (another user
// made it, mode 0644) is opened read-only: a flock needs no more, except
// on NFS.
func lockInit(ctx context.Context, lockPath string, timeout time.Duration) (unlock func(), err error) {
	f, err := openBeside(lockPath, true, true, 0o644)
	if errors.Is(err, fs.ErrPermission) {
		f, err = openBeside(lockPath, false, true, 0o644)
	}
	if errors.Is(err, ErrForeignFile) {
		return nil, err
	}
	if err != nil {
		return func() {}, nil
	}
	began := time.Now()
	deadline := began.Add(timeout)
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
			if errors.Is(err, syscall.EWOULDBLOCK) {
				return nil, fmt.Errorf("%w: %w: another process held %s for the %v waited (%d times busy_timeout)",
					ErrBusy, fenced.ErrUnavailable, lockPath, time.Since(began).Round(time.Millisecond), initLockWait)
			}
			return nil, fmt.Errorf("%w: lock %s: %v", fenced.ErrUnavailable, lockPath, err)
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
// driver.BatchRenewer, driver.BreakLogger, driver.Notifier (by change
// detection: see Subscribe) and driver.FenceFloorer.
type Driver struct {
	db    *sql.DB
	std   *sqllease.StdDB
	table string
	bell  doorbell
	queue queue
	watch watcher
	*sqllease.Engine
}

var _ driver.Driver = (*Driver)(nil)

var _ driver.Notifier = (*Driver)(nil) // by change detection, see watch.go

var _ driver.ObserveNotifier = (*Driver)(nil)

// New returns a driver over an open SQLite database, creating the lease and
// break tables if missing. The caller keeps ownership of db (Close does not
// close it). It should have been opened with a busy timeout. opts may be
// nil. A table that exists with another shape is an error (ErrSchema). So
// is a FIFO, a device or a symbolic link in the place of a file the driver
// keeps beside the database (ErrForeignFile).
func New(ctx context.Context, db *sql.DB, opts *Options) (*Driver, error) {
	return newDriver(ctx, db, opts, false)
}

// newDriver is New; ready says the caller found the tables set up (see
// tablesReady), so the migration is not looked at again.
func newDriver(ctx context.Context, db *sql.DB, opts *Options, ready bool) (*Driver, error) {
	table := ""
	if opts != nil {
		table = opts.Table
	}
	table, err := leasetable.TableOrDefault(table)
	if err != nil {
		return nil, err
	}
	d := &Driver{db: db, std: sqllease.NewStdDB(db, false), table: table}
	d.Engine = sqllease.New(d.dialect(), d.std)
	// The files beside the database are checked before anything is
	// created: a FIFO or a link there is refused, and nothing changes.
	file, err := mainFile(ctx, db)
	if err != nil {
		return nil, wrap("find the database file", err)
	}
	if file != "" {
		if err := checkBeside(file+waitersDirSuffix, true); err != nil {
			return nil, err
		}
	}
	if d.bell, err = newDoorbell(file); err != nil {
		return nil, err
	}
	if !ready {
		if err := d.migrate(ctx); err != nil {
			return nil, err
		}
	}
	d.queue.init(d, file)
	return d, nil
}

// mainFile returns the path of db's main database file, "" for an
// in-memory database.
func mainFile(ctx context.Context, db *sql.DB) (string, error) {
	rows, err := db.QueryContext(ctx, `PRAGMA database_list`)
	if err != nil {
		return "", err
	}
	defer rows.Close()
	path := ""
	for rows.Next() {
		var seq int
		var name, file string
		if err := rows.Scan(&seq, &name, &file); err != nil {
			return "", err
		}
		if name == "main" {
			path = file
		}
	}
	return path, rows.Err()
}

// TryAcquire implements driver.Driver. A refused try of a process with
// waiters for key stands it in the key's waiter queue again, at the end, if
// a ring took it off (see queue.go).
func (d *Driver) TryAcquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	f, err := d.Engine.TryAcquire(ctx, key, owner, ttl)
	if errors.Is(err, fenced.ErrHeld) {
		d.queue.refused(ctx, key)
	}
	return f, err
}

// Release implements driver.Driver, and rings the doorbells (see watcher).
// It rings whatever the outcome: a commit whose reply was lost may still
// have freed the key.
func (d *Driver) Release(ctx context.Context, g driver.Grant) error {
	defer d.ring(ctx, g.Key)
	return d.Engine.Release(ctx, g)
}

// Break implements driver.Driver, and rings the doorbells (see watcher).
func (d *Driver) Break(ctx context.Context, key string, reason, by string) (driver.LeaseInfo, error) {
	defer d.ring(ctx, key)
	return d.Engine.Break(ctx, key, reason, by)
}

// ring rings the shared doorbell and that of the process first in key's
// waiter queue, if the key is free. A cancelled ctx does not stop it: a
// release that committed must wake the next waiter.
func (d *Driver) ring(ctx context.Context, key string) {
	d.bell.ring()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), queueTimeout)
	defer cancel()
	d.queue.ringNext(ctx, key)
}

// now is SQLite's clock in Unix milliseconds, stable within one statement.
const now = `CAST(unixepoch('subsec') * 1000 AS INTEGER)`

// queries are the engine's statements (sqllease.Statements) and those
// only SQLite's dialect runs.
type queries struct {
	sqllease.Statements
	acquire, heldFor, renewBatch, pruneRaise, pruneCount, pruneDelete string
}

func newQueries(t string) queries {
	r := strings.NewReplacer("T_", t, "NOW", now)
	stmt := func(sql string) sqllease.Stmt { return sqllease.Stmt{SQL: r.Replace(sql)} }
	// candidates are the rows one prune batch deletes: up to ?3 rows
	// after key ?1 that expired before ?2.
	const candidates = `SELECT key, fence FROM T_ WHERE key > ?1 AND expires_ms < ?2 ORDER BY key LIMIT ?3`
	q := queries{
		// A grant's fence is one more than the larger of the row's counter
		// and the table's fence floor; a new row starts at floor + 1. The
		// statement runs under SQLite's write lock, so no prune can run
		// between its read of the floor and its write.
		acquire: r.Replace(`INSERT INTO T_ (key, owner, fence, expires_ms, granted_ms)
VALUES (?1, ?2, COALESCE((SELECT fence_floor FROM T__floor WHERE id = 1), 0) + 1, NOW + ?3, NOW)
ON CONFLICT (key) DO UPDATE SET
  fence = CASE WHEN T_.owner = excluded.owner AND T_.expires_ms > NOW THEN T_.fence ELSE max(T_.fence + 1, excluded.fence) END,
  granted_ms = CASE WHEN T_.owner = excluded.owner AND T_.expires_ms > NOW THEN T_.granted_ms ELSE excluded.granted_ms END,
  owner = excluded.owner,
  expires_ms = excluded.expires_ms
WHERE T_.owner IS NULL OR T_.expires_ms <= NOW OR T_.owner = excluded.owner
RETURNING fence`),
		heldFor: r.Replace(`SELECT expires_ms - NOW FROM T_ WHERE key = ?1`),
		// A prune batch writes the floor first, so that its transaction
		// holds the write lock before it reads the candidates: nothing can
		// change them before they are deleted.
		pruneRaise: r.Replace(`INSERT INTO T__floor (id, fence_floor) VALUES (1, COALESCE((SELECT max(fence) FROM (` + candidates + `)), 0))
ON CONFLICT (id) DO UPDATE SET fence_floor = max(fence_floor, excluded.fence_floor)
RETURNING fence_floor`),
		pruneCount:  r.Replace(`SELECT count(*), COALESCE(max(key), '') FROM (` + candidates + `)`),
		pruneDelete: r.Replace(`DELETE FROM T_ WHERE key IN (SELECT key FROM (` + candidates + `))`),
		// A batch renewal is this prefix, a VALUES row (?, ?, ?, ?) per
		// grant, then renewBatchTail.
		renewBatch: r.Replace(`WITH r(k, o, f, ttl) AS (VALUES `),
	}
	q.Statements = sqllease.Statements{
		Renew:   stmt(`UPDATE T_ SET expires_ms = NOW + ?4 WHERE key = ?1 AND owner = ?2 AND fence = ?3 AND expires_ms > NOW`),
		Release: stmt(`UPDATE T_ SET owner = NULL, expires_ms = 0 WHERE key = ?1 AND owner = ?2 AND fence = ?3`),
		Inspect: stmt(`SELECT owner, fence, expires_ms - NOW FROM T_ WHERE key = ?1`),
		List: stmt(`SELECT key, owner, fence, expires_ms - NOW FROM T_
WHERE substr(key, 1, length(?1)) = ?1 AND owner IS NOT NULL AND expires_ms > NOW ORDER BY key`),
		// The break transaction holds SQLite's write lock (a file opened
		// with OpenFile begins every transaction IMMEDIATE), and BreakRow
		// checks again that the key is held.
		LockRow: stmt(`SELECT owner, fence, expires_ms - NOW FROM T_ WHERE key = ?1`),
		BreakRow: stmt(`UPDATE T_ SET owner = NULL, expires_ms = 0
WHERE key = ?1 AND owner IS NOT NULL AND expires_ms > NOW`),
		Audit:  stmt(`INSERT INTO T__breaks (key, fence, owner, reason, by_whom, at_ms) VALUES (?1, ?2, ?3, ?4, ?5, NOW)`),
		Breaks: stmt(`SELECT at_ms * 1000, key, fence, owner, reason, by_whom FROM T__breaks WHERE ?1 = '' OR key = ?1 ORDER BY id`),
		Floor:  stmt(`SELECT COALESCE((SELECT fence_floor FROM T__floor WHERE id = 1), 0), COALESCE((SELECT max(fence) FROM T_), 0)`),
		RaiseFloor: stmt(`INSERT INTO T__floor (id, fence_floor) VALUES (1, ?1)
ON CONFLICT (id) DO UPDATE SET fence_floor = max(fence_floor, excluded.fence_floor)
RETURNING fence_floor`),
		PruneCutoff: stmt(`SELECT NOW - ?1`),
	}
	return q
}

// The shapes the driver needs, with the declared types pragma_table_info
// reports.
var (
	leaseShape = leasetable.Shape{
		Columns: []leasetable.Column{
			{Name: "key", Type: "text", Identity: true},
			{Name: "owner", Type: "text", Identity: true},
			{Name: "fence", Type: "integer"},
			{Name: "expires_ms", Type: "integer"},
			{Name: "granted_ms", Type: "integer"},
		},
		Key: "key",
	}
	breakShape = leasetable.Shape{
		Columns: []leasetable.Column{
			{Name: "id", Type: "integer"},
			{Name: "key", Type: "text", Identity: true},
			{Name: "fence", Type: "integer"},
			{Name: "owner", Type: "text"},
			{Name: "reason", Type: "text"},
			{Name: "by_whom", Type: "text"},
			{Name: "at_ms", Type: "integer"},
		},
	}
	floorShape = leasetable.Shape{
		Columns: []leasetable.Column{{Name: "id", Type: "integer"}, {Name: "fence_floor", Type: "integer"}},
		Key:     "id",
	}
)

// querier is what readTable needs of a connection.
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// migrate creates the missing tables and checks the shape of those that
// exist, in one transaction, so that a refusal changes nothing. The
// transaction is begun IMMEDIATE whatever the database's default: a
// deferred one would read the catalog first and could then fail to take
// the write lock (SQLITE_BUSY, without waiting) because another process
// wrote in between.
func (d *Driver) migrate(ctx context.Context) error {
	if tablesReady(ctx, d.db, d.table) {
		return nil // set up already: no write, no wait for the write lock
	}
	tx, err := d.db.Conn(ctx)
	if err != nil {
		return wrap("create lease tables", err)
	}
	defer tx.Close()
	if _, err := tx.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return wrap("create lease tables", err)
	}
	committed := false
	defer func() {
		if committed {
			return
		}
		if _, err := tx.ExecContext(context.WithoutCancel(ctx), "ROLLBACK"); err != nil {
			// Never hand a connection inside a transaction back to the pool.
			tx.Raw(func(any) error { return sqldriver.ErrBadConn })
		}
	}()
	for _, s := range tableSpecs(d.table) {
		found, exists, err := readTable(ctx, tx, s.name)
		if err != nil {
			return wrap("create lease tables", err)
		}
		if !exists {
			if _, err := tx.ExecContext(ctx, s.create); err != nil {
				return wrap("create table "+s.name, err)
			}
			continue
		}
		if err := leasetable.Check(s.name, s.shape, found); err != nil {
			return err
		}
	}
	t := d.table
	if _, err := tx.ExecContext(ctx,
		`CREATE INDEX IF NOT EXISTS `+t+waitersSuffix+`_by_key ON `+t+waitersSuffix+` (key, seq)`); err != nil {
		return wrap("create lease tables", err)
	}
	if _, err := tx.ExecContext(ctx,
		`INSERT INTO `+t+leasetable.FloorSuffix+` (id, fence_floor) VALUES (1, 0) ON CONFLICT (id) DO NOTHING`); err != nil {
		return wrap("create lease tables", err)
	}
	if _, err := tx.ExecContext(ctx, "COMMIT"); err != nil {
		return wrap("create lease tables", err)
	}
	committed = true
	return nil
}

// tableSpec is one table fenced keeps in the file: its name, the shape
// it must have, and the statement that creates it.
type tableSpec struct {
	name   string
	shape  leasetable.Shape
	create string
}

// tableSpecs returns the tables of lease table t.
func tableSpecs(t string) []tableSpec {
	return []tableSpec{
		{t, leaseShape, `CREATE TABLE ` + t + ` (
  key TEXT PRIMARY KEY NOT NULL,
  owner TEXT,
  fence INTEGER NOT NULL CHECK (fence > 0),
  expires_ms INTEGER NOT NULL,
  granted_ms INTEGER NOT NULL
) WITHOUT ROWID`},
		{t + leasetable.BreaksSuffix, breakShape, `CREATE TABLE ` + t + leasetable.BreaksSuffix + ` (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  key TEXT NOT NULL,
  fence INTEGER NOT NULL,
  owner TEXT NOT NULL,
  reason TEXT NOT NULL,
  by_whom TEXT NOT NULL,
  at_ms INTEGER NOT NULL
)`},
		{t + leasetable.FloorSuffix, floorShape, `CREATE TABLE ` + t + leasetable.FloorSuffix + ` (
  id INTEGER PRIMARY KEY CHECK (id = 1),
  fence_floor INTEGER NOT NULL CHECK (fence_floor >= 0)
)`},
		{t + waitersSuffix, waitersShape, `CREATE TABLE ` + t + waitersSuffix + ` (
  member TEXT PRIMARY KEY NOT NULL,
  key TEXT NOT NULL,
  seq INTEGER NOT NULL
) WITHOUT ROWID`},
		{t + sqllease.CheckpointsSuffix, checkpointsShape, createCheckpoints(t)},
	}
}

// tablesReady reports whether every table of lease table t is there in
// its shape, with the waiter index and the floor's row: what migrate would
// make. Any doubt (an error, a table missing or of another shape) is
// false, and the caller sets the file up under its locks, which reports
// the fault.
func tablesReady(ctx context.Context, q querier, t string) bool {
	for _, s := range tableSpecs(t) {
		found, exists, err := readTable(ctx, q, s.name)
		if err != nil || !exists || leasetable.Check(s.name, s.shape, found) != nil {
			return false
		}
	}
	var n int
	err := q.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM sqlite_schema WHERE type = 'index' AND name = ?1) +
  (SELECT count(*) FROM `+t+leasetable.FloorSuffix+` WHERE id = 1)`, t+waitersSuffix+"_by_key").Scan(&n)
	return err == nil && n == 2
}

// inWAL reports whether path is a SQLite database file already in WAL
// mode (its header's read and write versions are 2). Opening such a file
// switches nothing. Anything else, including a file that is not there
// yet or not a regular file, is false.
func inWAL(path string) bool {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return false
	}
	var h [20]byte
	if _, err := io.ReadFull(f, h[:]); err != nil {
		return false
	}
	return string(h[:16]) == "SQLite format 3\x00" && h[18] == 2 && h[19] == 2
}

// readTable reads the shape of table from SQLite's catalog: declared column
// types, unique indexes (with their collations), and how each column
// compares. SQLite has no pragma that names a column's collation. So it
// compares 'job:a' with its upper-case and space-padded forms under the
// column's own collation. The second result is false when the table does not
// exist.
func readTable(ctx context.Context, tx querier, table string) (leasetable.Existing, bool, error) {
	found := leasetable.Existing{Columns: map[string]leasetable.ExistingColumn{}}
	var kind string
	err := tx.QueryRowContext(ctx, `SELECT type FROM sqlite_schema WHERE name = ?1 AND type IN ('table', 'view')`, table).Scan(&kind)
	if errors.Is(err, sql.ErrNoRows) {
		return found, false, nil
	}
	if err != nil {
		return found, false, err
	}
	if kind != "table" {
		found.Problems = append(found.Problems, "it is a "+kind+", not a table")
		return found, true, nil
	}
	rows, err := tx.QueryContext(ctx, `SELECT name, type, pk FROM pragma_table_info(?1) ORDER BY cid`, table)
	if err != nil {
		return found, true, err
	}
	var names, pk []string
	for rows.Next() {
		var name, typ string
		var inPK int
		if err := rows.Scan(&name, &typ, &inPK); err != nil {
			rows.Close()
			return found, true, err
		}
		name = strings.ToLower(name)
		names = append(names, name)
		found.Columns[name] = leasetable.ExistingColumn{Type: strings.ToLower(typ)}
		if inPK > 0 {
			pk = append(pk, name)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return found, true, err
	}
	if err := probeCollations(ctx, tx, table, names, found.Columns); err != nil {
		return found, true, err
	}
	type index struct {
		name, origin string
		partial      bool
	}
	var indexes []index
	rows, err = tx.QueryContext(ctx, `SELECT name, origin, partial FROM pragma_index_list(?1) WHERE "unique"`, table)
	if err != nil {
		return found, true, err
	}
	for rows.Next() {
		var ix index
		if err := rows.Scan(&ix.name, &ix.origin, &ix.partial); err != nil {
			rows.Close()
			return found, true, err
		}
		indexes = append(indexes, ix)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return found, true, err
	}
	hasPKIndex := false
	for _, ix := range indexes {
		u := leasetable.UniqueIndex{Name: ix.name}
		if ix.partial {
			u.Defect = "has a WHERE clause, so it does not cover every row"
		}
		hasPKIndex = hasPKIndex || ix.origin == "pk"
		cols, err := tx.QueryContext(ctx,
			`SELECT cid, COALESCE(name, ''), coll FROM pragma_index_xinfo(?1) WHERE key ORDER BY seqno`, ix.name)
		if err != nil {
			return found, true, err
		}
		for cols.Next() {
			var cid int
			var name, coll string
			if err := cols.Scan(&cid, &name, &coll); err != nil {
				cols.Close()
				return found, true, err
			}
			u.Columns = append(u.Columns, strings.ToLower(name))
			if !strings.EqualFold(coll, "BINARY") && u.Defect == "" {
				u.Defect = fmt.Sprintf("uses collation %s, which can take different keys for equal", coll)
			}
		}
		cols.Close()
		if err := cols.Err(); err != nil {
			return found, true, err
		}
		found.Unique = append(found.Unique, u)
	}
	if !hasPKIndex && len(pk) == 1 {
		// An INTEGER PRIMARY KEY is the rowid itself and has no index of
		// its own.
		found.Unique = append(found.Unique, leasetable.UniqueIndex{Name: "PRIMARY KEY", Columns: pk})
	}
	return found, true, nil
}

// probeCollations sets Inexact on the columns of table whose collation
// takes 'job:a' for equal to 'JOB:A' or to 'job:a '. A compound SELECT's
// column takes the collation of its leftmost part, here the table's
// column, over a row that comes from the literal.
func probeCollations(ctx context.Context, tx querier, table string, names []string, cols map[string]leasetable.ExistingColumn) error {
	if len(names) == 0 {
		return nil
	}
	var sel, probes, lits []string
	for i, n := range names {
		a := fmt.Sprintf("c%d", i)
		sel = append(sel, sqlident.QuoteANSI(n)+` AS `+a)
		lits = append(lits, `'job:a'`)
		probes = append(probes, a+" = upper("+a+")", a+" = "+a+" || ' '")
	}
	q := `SELECT ` + strings.Join(probes, ", ") + ` FROM (SELECT ` + strings.Join(sel,
		", ") + ` FROM ` + table + ` WHERE 0 UNION ALL SELECT ` + strings.Join(lits, ", ") + `)`
	got := make([]bool, len(probes))
	dest := make([]any, len(probes))
	for i := range got {
		dest[i] = &got[i]
	}
	if err := tx.QueryRowContext(ctx, q).Scan(dest...); err != nil {
		return err
	}
	for i, n := range names {
		var how []string
		if got[2*i] {
			how = append(how, "compares case-insensitively (as COLLATE NOCASE does)")
		}
		if got[2*i+1] {
			how = append(how, "ignores trailing spaces (as COLLATE RTRIM does)")
		}
		if len(how) > 0 {
			c := cols[n]
			c.Inexact = "a collation that " + strings.Join(how, " and ")
			cols[n] = c
		}
	}
	return nil
}

// maxBatch bounds one batched renewal: 4 bound variables per grant, and
// SQLite refuses a statement with more than 32766 ("too many SQL
// variables"), which failed every renewal of a client holding more than
// 8191 leases.
const maxBatch = 1000

// renewBatchTail ends the batch renewal that queries.renewBatch starts.
func renewBatchTail(t string) string {
	return strings.NewReplacer("T_", t, "NOW", now).Replace(`) UPDATE T_ SET expires_ms = NOW + r.ttl FROM r
WHERE T_.key = r.k AND T_.owner = r.o AND T_.fence = r.f AND T_.expires_ms > NOW
RETURNING T_.key, T_.owner, T_.fence`)
}

// classify names the sentinel a SQLite error matches: a busy or locked
// database and I/O failures mean nothing was applied.
func classify(err error) error {
	var se *sqlite.Error
	if errors.As(err, &se) {
		switch se.Code() & 0xff {
		case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_IOERR,
			sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_FULL, sqlite3.SQLITE_READONLY:
			return fenced.ErrUnavailable
		}
	}
	if errors.Is(err, sql.ErrConnDone) {
		return fenced.ErrClosed
	}
	return nil
}

// busy reports whether err is SQLite's answer that another connection
// held a lock past the busy timeout.
func busy(err error) bool {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return false
	}
	c := se.Code() & 0xff
	return c == sqlite3.SQLITE_BUSY || c == sqlite3.SQLITE_LOCKED
}

// wrap wraps an error of opening or preparing the file.
func wrap(op string, err error) error { return sqllease.Wrap("sqlite", classify, op, "", err) }

// dialect is SQLite's part of the lease-table engine. SQLite counts time
// in milliseconds (unixepoch('subsec')).
func (d *Driver) dialect() *sqllease.Dialect {
	q := newQueries(d.table)
	tail := renewBatchTail(d.table)
	return &sqllease.Dialect{
		Name:       "sqlite",
		Unit:       time.Millisecond,
		MaxBatch:   maxBatch,
		Statements: q.Statements,

		Acquire: func(ctx context.Context, c sqllease.Conn, key, owner string, ttl int64) (uint64, int64, error) {
			var fence, left int64
			err := c.QueryRow(ctx, q.acquire, key, owner, ttl).Scan(&fence)
			if errors.Is(err, sql.ErrNoRows) {
				// Refused: a second read tells how long the holder has
				// left (best effort).
				if c.QueryRow(ctx, q.heldFor, key).Scan(&left) != nil {
					left = 0
				}
				return 0, left, nil
			}
			return uint64(fence), 0, err
		},
		RenewBatch: func(ctx context.Context, c sqllease.Conn, reqs []sqllease.Renewal) ([]driver.Grant, error) {
			var b strings.Builder
			args := make([]any, 0, 4*len(reqs))
			b.WriteString(q.renewBatch)
			for i, r := range reqs {
				if i > 0 {
					b.WriteString(", ")
				}
				b.WriteString("(?, ?, ?, ?)")
				args = append(args, r.Grant.Key, r.Grant.Owner, int64(r.Grant.Fence), r.TTL)
			}
			b.WriteString(tail)
			return sqllease.ScanGrants(c.Query(ctx, b.String(), args...))
		},
		PruneBatch:  q.pruneBatch,
		Classify:    classify,
		Checkpoints: checkpointStatements(d.table),
	}
}

// guarantees is what the backend promises, the part of Capabilities
// that says how far a lease can be trusted.
func (d *Driver) guarantees() driver.Capabilities {
	return driver.Capabilities{
		Fence:       fenced.FenceStrict,
		ServerClock: true,
		// unixepoch() inside the statement reads the host's wall clock.
		ClockStepSafe: false,
		Note: "one host: the fence counter is a row in the file and survives restarts; " +
			"expiry uses the host's wall clock inside the statement (not safe from clock steps); " +
			"each release and break wakes one waiting process, the one that waited longest, " +
			"through a doorbell file of its own that the commit opens once durable (inotify), and observers through a shared one; " +
			"PRAGMA data_version every 2ms where inotify is unavailable",
	}
}

// Capabilities implements driver.Driver: waiters and observers woken by
// the doorbell file (watch.go), and the lease table's batch renewal, break
// log, fence floor and prune.
func (d *Driver) Capabilities() driver.Capabilities {
	c := d.guarantees()
	c.Subscribe, c.Observe, c.BatchRenew, c.BreakLog, c.FenceFloor = true, true, true, true, true
	c.Checkpoint = true
	return c
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
	d.queue.close()
	_, err := d.Engine.Close()
	return err
}

// DB returns the underlying database, for guards that keep the protected
// resource in the same file.
func (d *Driver) DB() *sql.DB { return d.db }
