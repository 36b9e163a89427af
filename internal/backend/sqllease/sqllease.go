// Package sqllease is the lease-table engine of fenced's SQL backends
// (SQLite, PostgreSQL, MySQL/MariaDB). A backend is a Dialect (its
// statements, its TTL unit, the way its database signals a refused grant,
// its error classification), a Conn over its client library, a URL opener
// and, where the database can, a notifier. The engine keeps everything
// else once: the closed-driver rule (every operation after Close fails
// with fenced.ErrClosed, whoever owns the pool), the owner check, the TTL
// rule (ttlrule.Units: never shortened, rounded up to the dialect's
// unit), the reading of rows into driver.LeaseInfo, the per-grant result
// of a batched renewal, the break transaction with its audit row, the
// fence floor, the prune loop, and the wrapping of errors as
// "backend: operation "key": sentinel: cause".
//
// The package is internal because the Dialect type is still young: it
// changes with each database the family gains, and every dialect lives in
// this module.
//
// # Adding a SQL store
//
// A new store (CockroachDB, SQL Server, ...) is one small dialect file in
// its own package, beside a URL opener:
//
//  1. Create the tables: the lease table (key, owner, fence, expiry by the
//     database's clock), the audit table NAME_breaks and the floor table
//     NAME_floor, with leasetable.Check refusing a foreign table of the
//     wrong shape (see the postgres and mysql packages).
//  2. Fill a Dialect: one atomic grant statement (Acquire), the renew,
//     release, inspect, list, break and floor statements, each with the
//     arguments in the order documented on Statements, the TTL unit the
//     database counts in, and Classify, which says which of the
//     database's errors mean "nothing was applied" (fenced.ErrUnavailable)
//     and which "perhaps applied" (fenced.ErrUnknownOutcome).
//  3. Wrap the client: StdDB for a database/sql pool, or a few lines over
//     the native client (fencedpostgres/conn.go over pgx).
//  4. Embed the *Engine that New returns in the backend's Driver, and run
//     drivertest.RunConformanceTests and drivertest.RunFloorTests against
//     a real server.
package sqllease

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/backend/errclass"
	"github.com/fenced-dev/fenced/internal/backend/leasetable"
	"github.com/fenced-dev/fenced/internal/core/ttlrule"
)

// Result is what a statement run with Conn.Exec reports.
type Result struct {
	// RowsAffected is the number of rows the statement changed (or, for a
	// SELECT run with Exec, returned).
	RowsAffected int64
	// LastInsertID is MySQL's LAST_INSERT_ID() after the statement; zero
	// where the database has no such value.
	LastInsertID int64
}

// Rows is a result set being read. Close may be called more than once.
type Rows interface {
	leasetable.Rows
	Close()
}

// Conn runs statements, on a pool or inside a transaction. A Conn must
// report a missing row from QueryRow's Scan as sql.ErrNoRows.
type Conn interface {
	Exec(ctx context.Context, query string, args ...any) (Result, error)
	QueryRow(ctx context.Context, query string, args ...any) leasetable.Scanner
	Query(ctx context.Context, query string, args ...any) (Rows, error)
}

// DB is a Conn over a pool that can also run a transaction.
type DB interface {
	Conn
	// InTx runs fn in one transaction, committed when fn returns nil and
	// rolled back otherwise.
	InTx(ctx context.Context, fn func(Conn) error) error
	// Close releases what the adapter holds (prepared statements, and the
	// pool itself when the driver opened it).
	Close() error
}

// Statements are a dialect's SQL, built once from the validated table
// name. Values always travel as bind parameters, in the order given here
// unless Args says otherwise.
type Statements struct {
	// Renew extends a grant: arguments key, owner, fence, ttl (in the
	// dialect's unit). It must change the row only when owner and fence
	// match and the grant has not expired.
	Renew Stmt
	// Release frees a grant and keeps the row: key, owner, fence.
	Release Stmt
	// Inspect reads a key: key; columns owner ("" or NULL when free),
	// fence, time left in the dialect's unit.
	Inspect Stmt
	// List reads the held keys starting with a prefix, sorted byte-wise:
	// prefix; columns key, owner, fence, time left.
	List Stmt
	// LockRow is Inspect inside the break transaction, locking the row
	// where the database needs it (FOR UPDATE).
	LockRow Stmt
	// BreakRow frees a key whoever holds it: key. It may refuse (change
	// no row) when the key is not held.
	BreakRow Stmt
	// Audit records a break: key, fence, shortened owner, reason, by.
	Audit Stmt
	// Notify, when set, wakes the key's waiters inside the break
	// transaction: key.
	Notify Stmt
	// Breaks reads the audit rows: key ("" for all), as
	// leasetable.BreakColumns, oldest first.
	Breaks Stmt
	// Floor reads the fence floor and the highest fence in the table.
	Floor Stmt
	// PruneCutoff reads the database's clock minus an age (in the
	// dialect's unit): the expiry before which Prune deletes rows.
	PruneCutoff Stmt
	// RaiseFloor raises the fence floor to at least its argument and
	// returns the floor now, in one statement; unused when
	// Dialect.RaiseFloor is set.
	RaiseFloor Stmt
}

// Args are the values an operation binds; Stmt.Args picks from them.
type Args struct {
	Key, Owner string
	Fence      uint64
	// TTL is in the dialect's unit.
	TTL    int64
	Prefix string
	// BreakFence and BreakOwner (shortened) are what a break ended;
	// Reason and By say why and who.
	BreakFence int64
	BreakOwner string
	Reason, By string
}

// Stmt is one statement with the order of its arguments.
type Stmt struct {
	SQL string
	// Args, when set, returns the bind arguments (for dialects whose
	// placeholders are positional only, or that bind a value in another
	// type); nil means the order Statements documents.
	Args func(Args) []any
}

// Renewal is one grant of a batched renewal, its TTL in the dialect's
// unit.
type Renewal struct {
	Grant driver.Grant
	TTL   int64
}

// ScanGrants reads the grants a batch renewal selected or returned, as
// rows of key, owner, fence, for Dialect.RenewBatch; it closes rows. It
// passes err (from the query that made rows) through.
func ScanGrants(rows Rows, err error) ([]driver.Grant, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []driver.Grant
	for rows.Next() {
		var g driver.Grant
		var fence int64
		if err := rows.Scan(&g.Key, &g.Owner, &fence); err != nil {
			return nil, err
		}
		g.Fence = uint64(fence)
		out = append(out, g)
	}
	return out, rows.Err()
}

// Dialect is what a SQL store brings to the engine.
type Dialect struct {
	// Name prefixes every error ("postgres").
	Name string
	// Unit is what the database counts TTLs and remaining times in
	// (time.Microsecond, time.Millisecond). Every TTL is rounded up to it
	// with ttlrule.Units.
	Unit time.Duration
	Statements
	// Acquire is the one atomic grant: grant key to owner for ttl (in
	// Unit) if the key is free, expired or already owner's, and return
	// the fence; or return fence 0 and the time the holder has left (in
	// Unit, 0 when unknown).
	Acquire func(ctx context.Context, c Conn, key, owner string, ttl int64) (fence uint64, remaining int64, err error)
	// RenewedByInsertID makes the engine take a renewal as done when
	// Renew's LAST_INSERT_ID equals the fence (MySQL, whose affected-row
	// count depends on client flags), instead of one affected row.
	RenewedByInsertID bool
	// RenewBatch renews reqs in one round trip where it can and returns
	// the grants it renewed, owner included. MaxBatch, when positive,
	// bounds len(reqs); the engine splits larger batches.
	RenewBatch func(ctx context.Context, c Conn, reqs []Renewal) ([]driver.Grant, error)
	MaxBatch   int
	// RaiseFloor, when set, raises the fence floor to at least floor
	// and returns the floor now, for a database that cannot do it in the
	// one statement Statements.RaiseFloor (MySQL has no RETURNING).
	RaiseFloor func(ctx context.Context, db DB, floor uint64) (uint64, error)
	// PruneBatch is one transaction of Prune: delete up to
	// leasetable.PruneBatchSize rows after key after whose expiry is
	// before cutoff (as PruneCutoff returned it), raising the floor to the
	// highest fence deleted.
	PruneBatch func(ctx context.Context, db DB, cutoff any, after string) (leasetable.PruneBatch, error)
	// Classify is the database's error-classification hook (see
	// errclass.Func): fenced.ErrUnavailable when err means that
	// nothing was applied, fenced.ErrUnknownOutcome when the request may
	// have been applied, fenced.ErrClosed when the pool was closed, and
	// nil for any other error (which is then reported as it is).
	Classify errclass.Func
	// Checkpoints, when set, are the checkpoint statements; without them
	// the engine's Checkpointer methods refuse with fenced.ErrUnsupported.
	Checkpoints *CheckpointStatements
}

// Engine implements the lease operations of driver.Driver,
// driver.BatchRenewer, driver.BreakLogger and driver.FenceFloorer over a
// Dialect and a DB. A backend embeds it in its Driver. Its methods are
// safe for concurrent use.
type Engine struct {
	d  *Dialect
	db DB

	mu     sync.Mutex
	closed bool
}

var _ interface {
	driver.BatchRenewer
	driver.BreakLogger
	driver.FenceFloorer
} = (*Engine)(nil)

// New returns an engine for dialect over db. The engine closes db in
// Close.
func New(dialect *Dialect, db DB) *Engine { return &Engine{d: dialect, db: db} }

// CheckOpen returns fenced.ErrClosed after Close.
func (e *Engine) CheckOpen() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return fmt.Errorf("%s: %w", e.d.Name, fenced.ErrClosed)
	}
	return nil
}

// Close marks the engine closed and closes its DB; it reports false, and
// does nothing, when it was closed already. Grants are left to expire.
func (e *Engine) Close() (first bool, err error) {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return false, nil
	}
	e.closed = true
	e.mu.Unlock()
	return true, e.db.Close()
}

// Wrap wraps err from operation op on key (may be "") once, so that it
// matches the sentinel the dialect's Classify names.
func (e *Engine) Wrap(op, key string, err error) error {
	return Wrap(e.d.Name, e.d.Classify, op, key, err)
}

// Wrap is Engine.Wrap for code that runs without an engine (a backend's own
// helpers). Its form is "name: op "key": sentinel: cause". The sentinel is
// the one errclass.Wrap gives with the dialect's classify hook; every
// statement is taken as one that may have been applied. Refusals
// (errclass.IsRefusal) are returned as they are.
func Wrap(name string, classify errclass.Func, op, key string, err error) error {
	if errclass.IsRefusal(err) {
		return err
	}
	where := op
	if key != "" {
		where = fmt.Sprintf("%s %q", op, key)
	}
	return fmt.Errorf("%s: %s: %w", name, where, errclass.Wrap(err, true, classify))
}

func (e *Engine) units(d time.Duration) int64 { return ttlrule.Units(d, e.d.Unit) }

func (e *Engine) duration(n int64) time.Duration { return time.Duration(n) * e.d.Unit }

func (s Stmt) args(a Args, def ...any) []any {
	if s.Args != nil {
		return s.Args(a)
	}
	return def
}

// TryAcquire implements driver.Driver with the dialect's one statement.
func (e *Engine) TryAcquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	if err := e.CheckOpen(); err != nil {
		return 0, err
	}
	if err := leasetable.CheckOwner(owner); err != nil {
		return 0, fmt.Errorf("%s: acquire %q: %w", e.d.Name, key, err)
	}
	fence, remaining, err := e.d.Acquire(ctx, e.db, key, owner, e.units(ttl))
	switch {
	case err != nil:
		return 0, e.Wrap("acquire", key, err)
	case fence == 0:
		return 0, leasetable.Held(key, e.duration(remaining))
	}
	return fence, nil
}

// Renew implements driver.Driver in one statement.
func (e *Engine) Renew(ctx context.Context, g driver.Grant) error {
	if err := e.CheckOpen(); err != nil {
		return err
	}
	if err := ttlrule.Check(g); err != nil {
		return err
	}
	if g.Owner == "" {
		return leasetable.NotHeld(g)
	}
	a := Args{Key: g.Key, Owner: g.Owner, Fence: g.Fence, TTL: e.units(g.TTL)}
	res, err := e.db.Exec(ctx, e.d.Renew.SQL, e.d.Renew.args(a, g.Key, g.Owner, int64(g.Fence), a.TTL)...)
	if err != nil {
		return e.Wrap("renew", g.Key, err)
	}
	renewed := res.RowsAffected == 1
	if e.d.RenewedByInsertID {
		renewed = res.LastInsertID != 0 && uint64(res.LastInsertID) == g.Fence
	}
	if !renewed {
		return leasetable.NotHeld(g)
	}
	return nil
}

// RenewBatch implements driver.BatchRenewer: one round trip per
// Dialect.MaxBatch grants, and one ErrNotHeld per grant not renewed.
func (e *Engine) RenewBatch(ctx context.Context, grants []driver.Grant) ([]error, error) {
	if err := e.CheckOpen(); err != nil {
		return nil, err
	}
	if err := ttlrule.CheckAll(grants); err != nil {
		return nil, err
	}
	errs := make([]error, 0, len(grants))
	for len(grants) > 0 {
		n := len(grants)
		if e.d.MaxBatch > 0 {
			n = min(n, e.d.MaxBatch)
		}
		chunk := make([]Renewal, n)
		for i, g := range grants[:n] {
			chunk[i] = Renewal{Grant: g, TTL: e.units(g.TTL)}
		}
		got, err := e.d.RenewBatch(ctx, e.db, chunk)
		if err != nil {
			return nil, e.Wrap("renew batch", "", err)
		}
		renewed := make(map[driver.Grant]bool, len(got))
		for _, g := range got {
			renewed[grantID(g)] = true
		}
		for _, g := range grants[:n] {
			var err error
			if !renewed[grantID(g)] || g.Owner == "" {
				err = leasetable.NotHeld(g)
			}
			errs = append(errs, err)
		}
		grants = grants[n:]
	}
	return errs, nil
}

// Release implements driver.Driver in one statement (which, where the
// dialect notifies, also wakes the key's waiters).
func (e *Engine) Release(ctx context.Context, g driver.Grant) error {
	if err := e.CheckOpen(); err != nil {
		return err
	}
	if g.Owner == "" {
		return leasetable.NotHeld(g)
	}
	a := Args{Key: g.Key, Owner: g.Owner, Fence: g.Fence}
	res, err := e.db.Exec(ctx, e.d.Release.SQL, e.d.Release.args(a, g.Key, g.Owner, int64(g.Fence))...)
	if err != nil {
		return e.Wrap("release", g.Key, err)
	}
	if res.RowsAffected != 1 {
		return leasetable.NotHeld(g)
	}
	return nil
}

// readRow reads owner, fence and time left of key with s.
func (e *Engine) readRow(ctx context.Context, c Conn, s Stmt, key string) (driver.LeaseInfo, error) {
	var owner sql.NullString
	var fence, remaining int64
	err := c.QueryRow(ctx, s.SQL, s.args(Args{Key: key}, key)...).Scan(&owner, &fence, &remaining)
	if err != nil {
		return driver.LeaseInfo{Key: key}, err
	}
	return leasetable.Info(key, owner.String, fence, e.duration(remaining)), nil
}

// Inspect implements driver.Driver.
func (e *Engine) Inspect(ctx context.Context, key string) (driver.LeaseInfo, error) {
	if err := e.CheckOpen(); err != nil {
		return driver.LeaseInfo{Key: key}, err
	}
	info, err := e.readRow(ctx, e.db, e.d.Inspect, key)
	if errors.Is(err, sql.ErrNoRows) {
		return driver.LeaseInfo{Key: key}, fmt.Errorf("%s: %w", key, fenced.ErrNotFound)
	}
	if err != nil {
		return driver.LeaseInfo{Key: key}, e.Wrap("inspect", key, err)
	}
	return info, nil
}

// List implements driver.Driver. Keys are sorted byte-wise.
func (e *Engine) List(ctx context.Context, prefix string) ([]driver.LeaseInfo, error) {
	if err := e.CheckOpen(); err != nil {
		return nil, err
	}
	rows, err := e.db.Query(ctx, e.d.List.SQL, e.d.List.args(Args{Prefix: prefix}, prefix)...)
	if err != nil {
		return nil, e.Wrap("list", prefix, err)
	}
	defer rows.Close()
	var out []driver.LeaseInfo
	for rows.Next() {
		var key string
		var owner sql.NullString
		var fence, remaining int64
		if err := rows.Scan(&key, &owner, &fence, &remaining); err != nil {
			return nil, e.Wrap("list", prefix, err)
		}
		out = append(out, leasetable.Info(key, owner.String, fence, e.duration(remaining)))
	}
	if err := rows.Err(); err != nil {
		return nil, e.Wrap("list", prefix, err)
	}
	return out, nil
}

// Break implements driver.Driver. In one transaction it reads the key's row
// (locked), frees it, records an audit row and, where the dialect notifies,
// wakes the key's waiters. A key not held is refused with fenced.ErrNotHeld
// and nothing is written.
func (e *Engine) Break(ctx context.Context, key string, reason, by string) (driver.LeaseInfo, error) {
	if err := e.CheckOpen(); err != nil {
		return driver.LeaseInfo{Key: key}, err
	}
	notHeld := fmt.Errorf("%s: %w", key, fenced.ErrNotHeld)
	var info driver.LeaseInfo
	err := e.db.InTx(ctx, func(c Conn) error {
		var err error
		info, err = e.readRow(ctx, c, e.d.LockRow, key)
		if errors.Is(err, sql.ErrNoRows) || (err == nil && !info.Held) {
			return notHeld
		}
		if err != nil {
			return err
		}
		res, err := c.Exec(ctx, e.d.BreakRow.SQL, e.d.BreakRow.args(Args{Key: key}, key)...)
		if err != nil {
			return err
		}
		if res.RowsAffected == 0 {
			return notHeld
		}
		a := Args{Key: key, BreakFence: int64(info.Fence), BreakOwner: info.Owner, Reason: reason, By: by}
		if _, err := c.Exec(ctx, e.d.Audit.SQL, e.d.Audit.args(a, key, a.BreakFence, info.Owner, reason, by)...); err != nil {
			return err
		}
		if e.d.Notify.SQL != "" {
			_, err = c.Exec(ctx, e.d.Notify.SQL, e.d.Notify.args(a, key)...)
		}
		return err
	})
	if err != nil {
		return driver.LeaseInfo{Key: key}, e.Wrap("break", key, err)
	}
	return info, nil
}

// Breaks implements driver.BreakLogger.
func (e *Engine) Breaks(ctx context.Context, key string) ([]driver.BreakRecord, error) {
	if err := e.CheckOpen(); err != nil {
		return nil, err
	}
	rows, err := e.db.Query(ctx, e.d.Breaks.SQL, e.d.Breaks.args(Args{Key: key}, key)...)
	if err != nil {
		return nil, e.Wrap("breaks", key, err)
	}
	defer rows.Close()
	out, err := leasetable.ScanBreaks(rows)
	if err != nil {
		return nil, e.Wrap("breaks", key, err)
	}
	return out, nil
}

// FenceFloor implements driver.FenceFloorer. MaxFence reads the whole
// lease table.
func (e *Engine) FenceFloor(ctx context.Context) (floor, maxFence uint64, err error) {
	if err := e.CheckOpen(); err != nil {
		return 0, 0, err
	}
	var f, m int64
	if err := e.db.QueryRow(ctx, e.d.Floor.SQL).Scan(&f, &m); err != nil {
		return 0, 0, e.Wrap("fence floor", "", err)
	}
	return uint64(f), uint64(m), nil
}

// RaiseFenceFloor implements driver.FenceFloorer. A floor above
// limits.MaxFenceFloor is refused with fenced.ErrInvalidFloor.
func (e *Engine) RaiseFenceFloor(ctx context.Context, floor uint64) (uint64, error) {
	if err := e.CheckOpen(); err != nil {
		return 0, err
	}
	if err := leasetable.CheckFloor(floor); err != nil {
		return 0, fmt.Errorf("%s: raise fence floor: %w", e.d.Name, err)
	}
	var now uint64
	var err error
	if e.d.RaiseFloor != nil {
		now, err = e.d.RaiseFloor(ctx, e.db, floor)
	} else {
		var n int64
		err = e.db.QueryRow(ctx, e.d.Statements.RaiseFloor.SQL, int64(floor)).Scan(&n)
		now = uint64(n)
	}
	if err != nil {
		return 0, e.Wrap("raise fence floor", "", err)
	}
	return now, nil
}

// Prune implements driver.FenceFloorer: it reads the cutoff by the database's
// clock once, then runs the dialect's batches with
// leasetable.PruneInBatches. A negative age is refused with
// fenced.ErrInvalidTTL.
func (e *Engine) Prune(ctx context.Context, olderThan time.Duration) (deleted int64, floor uint64, err error) {
	if err := e.CheckOpen(); err != nil {
		return 0, 0, err
	}
	if err := leasetable.CheckOlderThan(olderThan); err != nil {
		return 0, 0, fmt.Errorf("%s: %w", e.d.Name, err)
	}
	var cutoff any
	if err := e.db.QueryRow(ctx, e.d.PruneCutoff.SQL, e.units(olderThan)).Scan(&cutoff); err != nil {
		return 0, 0, e.Wrap("prune", "", err)
	}
	deleted, floor, err = leasetable.PruneInBatches(ctx, func(after string) (leasetable.PruneBatch, error) {
		return e.d.PruneBatch(ctx, e.db, cutoff, after)
	})
	if err != nil {
		return deleted, floor, e.Wrap("prune", "", err)
	}
	if deleted == 0 {
		now, _, err := e.FenceFloor(ctx)
		return 0, max(floor, now), err
	}
	return deleted, floor, nil
}

// grantID is g without its TTL, which plays no part in identifying a
// grant: the grants a dialect's RenewBatch returns carry none.
func grantID(g driver.Grant) driver.Grant {
	g.TTL = 0
	return g
}
