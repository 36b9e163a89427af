package proof

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"

	_ "modernc.org/sqlite" // the scratch resource's driver

	"github.com/fenced-dev/fenced/fence"
)

// Resource is the protected resource of a run: a scratch SQLite file. Per
// key, it holds a ledger and the invoices "sent" by each append. The ledger
// is an append-only log whose head row carries the guard's fence and owner
// columns. Every worker process opens it. SQLite serialises their
// transactions. So the order of the ledger's rows is the order in which the
// resource accepted the writes.
//
// Tables: ledger_head(key, length, fence, fence_owner) is the guarded row.
// ledger(seq, op, key, n, fence, owner, worker) has one row per accepted
// append, n being the entry number (the length after the append).
// invoices(seq, op, key, n, worker) is the side effect "send invoice n
// once". claims(op, key, fence, owner) records every claim the guard
// accepted. So the checker can tell what a killed worker's claim did.
type Resource struct {
	db    *sql.DB
	guard *fence.SQL
}

// OpenResource opens (creating it if needed) the scratch resource at path.
func OpenResource(path string) (*Resource, error) {
	db, err := openResourceDB(path)
	if err != nil {
		return nil, err
	}
	g, err := fence.NewSQL(db, fence.SQLite, fence.Table{Name: "ledger_head", Key: "key"}, nil)
	if err != nil {
		db.Close()
		return nil, err
	}
	return &Resource{db: db, guard: g}, nil
}

// Close closes the database.
func (r *Resource) Close() error { return r.db.Close() }

// Setup creates the tables and one ledger per key, empty. It is run once by
// the controller before any worker starts.
func (r *Resource) Setup(ctx context.Context, keys []string) error {
	stmts := []string{
		`CREATE TABLE IF NOT EXISTS ledger_head (key TEXT PRIMARY KEY, length INTEGER NOT NULL DEFAULT 0)`,
		`CREATE TABLE IF NOT EXISTS ledger (seq INTEGER PRIMARY KEY AUTOINCREMENT, op INTEGER NOT NULL, key TEXT NOT NULL, ` +
			`n INTEGER NOT NULL, fence INTEGER NOT NULL, owner TEXT NOT NULL, worker INTEGER NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS invoices (seq INTEGER PRIMARY KEY AUTOINCREMENT, op INTEGER NOT NULL, key TEXT NOT NULL, ` +
			`n INTEGER NOT NULL, worker INTEGER NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS claims (op INTEGER PRIMARY KEY, key TEXT NOT NULL, fence INTEGER NOT NULL, owner TEXT NOT NULL)`,
	}
	for _, s := range stmts {
		if _, err := r.db.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("proof: set up resource: %w", err)
		}
	}
	if err := r.guard.EnsureColumns(ctx); err != nil {
		return err
	}
	for _, k := range keys {
		if _, err := r.db.ExecContext(ctx, `INSERT OR IGNORE INTO ledger_head (key) VALUES (?)`, k); err != nil {
			return fmt.Errorf("proof: set up resource: %w", err)
		}
	}
	return nil
}

// Outcome is what the resource did with a claim or a write.
type Outcome struct {
	// Applied is true when the resource accepted it.
	Applied bool
	// Length is the ledger length read (claims and reads).
	Length int64
	// Current is the resource's fence when it refused.
	Current uint64
}

// ClaimRead records t's fence on key's ledger (the claim-first ordering)
// and reads the ledger length, in one transaction. A stale holder's write
// that arrives after it is refused. The length read is the state the holder
// inherits. op is recorded with the claim.
func (r *Resource) ClaimRead(ctx context.Context, key string, t fence.Token, op int64) (Outcome, error) {
	tx, err := r.db.BeginTx(ctx, nil)
	if err != nil {
		return Outcome{}, err
	}
	defer tx.Rollback()
	res, err := r.guard.Claim(ctx, tx, key, t)
	if err != nil {
		return Outcome{}, err
	}
	if res.Outcome != fence.Applied {
		return Outcome{Current: res.Current}, nil
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO claims (op, key, fence, owner) VALUES (?, ?, ?, ?)`, op, key, int64(t.Fence),
		t.Owner); err != nil {
		return Outcome{}, err
	}
	var n int64
	if err := tx.QueryRowContext(ctx, `SELECT length FROM ledger_head WHERE key = ?`, key).Scan(&n); err != nil {
		return Outcome{}, err
	}
	return Outcome{Applied: true, Length: n}, tx.Commit()
}

// Read reads key's ledger length without claiming (the write-only ordering,
// and every read with fencing off).
func (r *Resource) Read(ctx context.Context, key string) (int64, error) {
	var n int64
	err := r.db.QueryRowContext(ctx, `SELECT length FROM ledger_head WHERE key = ?`, key).Scan(&n)
	return n, err
}

// Append appends entry prev+1 to key's ledger and sends its invoice, in one
// transaction. With fencing, the append is a guarded update carrying t. It
// is refused when the ledger has recorded a newer fence, or the same fence
// from another owner. Without fencing, it is a plain update, as a resource
// that ignores fences would do. worker and op are recorded with the rows.
func (r *Resource) Append(ctx context.Context, key string, t fence.Token, prev int64, fencing bool, worker int, op int64) (Outcome, error) {
	tx, err := r.db.BeginTx(ctx, nil)
	if err != nil {
		return Outcome{}, err
	}
	defer tx.Rollback()
	if fencing {
		res, err := r.guard.Update(ctx, tx, key, t, fence.Write{Set: "length = ?", SetArgs: []any{prev + 1}})
		if err != nil {
			return Outcome{}, err
		}
		if res.Outcome != fence.Applied {
			return Outcome{Current: res.Current}, nil
		}
	} else {
		res, err := tx.ExecContext(ctx, `UPDATE ledger_head SET length = ?, fence = ?, fence_owner = ? WHERE key = ?`, prev+1,
			int64(t.Fence), t.Owner, key)
		if err != nil {
			return Outcome{}, err
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return Outcome{}, fmt.Errorf("proof: ledger %q has no head row", key)
		}
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO ledger (op, key, n, fence, owner, worker) VALUES (?, ?, ?, ?, ?, ?)`, op, key, prev+1,
		int64(t.Fence), t.Owner, worker); err != nil {
		return Outcome{}, err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO invoices (op, key, n, worker) VALUES (?, ?, ?, ?)`, op, key, prev+1, worker); err != nil {
		return Outcome{}, err
	}
	return Outcome{Applied: true}, tx.Commit()
}

// LedgerRow is one accepted append, in the resource's order.
type LedgerRow struct {
	Seq, Op int64
	Key     string
	N       int64
	Fence   uint64
	Owner   string
	Worker  int
}

// Contents is what the resource holds at the end of a run.
type Contents struct {
	// Ledger is every accepted append, in the order the resource accepted
	// them.
	Ledger []LedgerRow
	// Invoices counts the invoices sent per key and entry number.
	Invoices map[string]map[int64]int
	// Claims maps the op of every accepted claim to its fence.
	Claims map[int64]uint64
}

// Contents reads the resource's final state.
func (r *Resource) Contents(ctx context.Context) (Contents, error) {
	c := Contents{Invoices: map[string]map[int64]int{}, Claims: map[int64]uint64{}}
	rows, err := r.db.QueryContext(ctx, `SELECT seq, op, key, n, fence, owner, worker FROM ledger ORDER BY seq`)
	if err != nil {
		return c, err
	}
	for rows.Next() {
		var l LedgerRow
		var f int64
		if err := rows.Scan(&l.Seq, &l.Op, &l.Key, &l.N, &f, &l.Owner, &l.Worker); err != nil {
			rows.Close()
			return c, err
		}
		l.Fence = uint64(f)
		c.Ledger = append(c.Ledger, l)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return c, err
	}
	rows, err = r.db.QueryContext(ctx, `SELECT key, n, COUNT(*) FROM invoices GROUP BY key, n`)
	if err != nil {
		return c, err
	}
	for rows.Next() {
		var k string
		var n int64
		var cnt int
		if err := rows.Scan(&k, &n, &cnt); err != nil {
			rows.Close()
			return c, err
		}
		if c.Invoices[k] == nil {
			c.Invoices[k] = map[int64]int{}
		}
		c.Invoices[k][n] = cnt
	}
	rows.Close()
	rows, err = r.db.QueryContext(ctx, `SELECT op, fence FROM claims`)
	if err != nil {
		return c, err
	}
	defer rows.Close()
	for rows.Next() {
		var op, f int64
		if err := rows.Scan(&op, &f); err != nil {
			return c, err
		}
		c.Claims[op] = uint64(f)
	}
	return c, errors.Join(rows.Err())
}

// openResourceDB opens the SQLite file of a scratch resource at path: WAL,
// immediate transactions, one connection, waiting for locks up to 30 s.
func openResourceDB(path string) (*sql.DB, error) {
	dsn := "file:" + (&url.URL{Path: path}).EscapedPath() + "?" + url.Values{
		"_pragma": {"busy_timeout(30000)", "journal_mode(WAL)", "synchronous(NORMAL)"},
		"_txlock": {"immediate"},
	}.Encode()
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("proof: open resource: %w", err)
	}
	db.SetMaxOpenConns(1)
	return db, nil
}
