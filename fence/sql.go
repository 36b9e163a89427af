package fence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/backend/sqlident"
)

// Dialect selects the SQL spoken by a guarded database.
type Dialect int

const (
	// SQLite, for example through modernc.org/sqlite (driver name "sqlite").
	SQLite Dialect = iota + 1
	// Postgres is PostgreSQL, for example through pgx's database/sql driver
	// ("pgx"). Placeholders are $1, $2, ...
	Postgres
	// MySQL is MySQL or MariaDB through github.com/go-sql-driver/mysql.
	MySQL
)

// String returns the dialect's name.
func (d Dialect) String() string {
	switch d {
	case SQLite:
		return "sqlite"
	case Postgres:
		return "postgres"
	case MySQL:
		return "mysql"
	}
	return fmt.Sprintf("Dialect(%d)", int(d))
}

// ParseDialect maps a name (sqlite, sqlite3, postgres, postgresql, pgx,
// mysql, mariadb; case-insensitive) to a Dialect.
func ParseDialect(name string) (Dialect, error) {
	switch strings.ToLower(name) {
	case "sqlite", "sqlite3":
		return SQLite, nil
	case "postgres", "postgresql", "pgx":
		return Postgres, nil
	case "mysql", "mariadb":
		return MySQL, nil
	}
	return 0, fmt.Errorf("fence: unknown SQL dialect %q (want sqlite, postgres or mysql)", name)
}

// placeholder returns the dialect's n-th (1-based) bind parameter.
func (d Dialect) placeholder(n int) string {
	if d == Postgres {
		return fmt.Sprintf("$%d", n)
	}
	return "?"
}

// quote quotes a validated identifier, with a schema prefix if any.
func (d Dialect) quote(ident string) string {
	parts := strings.Split(ident, ".")
	for i, p := range parts {
		if d == MySQL {
			parts[i] = "`" + p + "`"
		} else {
			parts[i] = `"` + p + `"`
		}
	}
	return strings.Join(parts, ".")
}

// sameBytes returns a comparison of column col with placeholder p that is
// byte-exact whatever collation the column was declared with (a
// case-insensitive MySQL collation would otherwise take owner "worker-a"
// for "Worker-A").
func (d Dialect) sameBytes(col, p string) string {
	switch d {
	case Postgres:
		return fmt.Sprintf(`%s = %s COLLATE "C"`, col, p)
	case MySQL:
		return fmt.Sprintf("CAST(%s AS BINARY) = CAST(%s AS BINARY)", col, p)
	}
	return fmt.Sprintf("%s = %s COLLATE BINARY", col, p)
}

// Default column names added by EnsureColumns.
const (
	DefaultFenceColumn    = "fence"
	DefaultOwnerColumn    = "fence_owner"
	DefaultLeaseKeyColumn = "fence_key"
)

// DefaultTimeout is the default SQLOptions.Timeout.
const DefaultTimeout = 5 * time.Second

// Table names a guarded table and its columns. Identifiers must match
// [A-Za-z_][A-Za-z0-9_]* (at most 63 bytes); Name may carry one schema
// prefix ("billing.invoice_jobs"). They are quoted, so they are matched with
// the exact spelling the database stores (PostgreSQL folds unquoted names to
// lower case when a table is created).
//
// Every guarded row is bound to one lease key. Fences are only comparable
// within one key, so a row written under "invoice:inv_72" refuses a token
// of "batch:all" whatever its fence (ErrWrongKey). The row records the key
// beside its fence (LeaseKeyColumn), binding itself to the first key that
// writes it. Set LeaseKey as well to fix the key before the first write.
type Table struct {
	// Name is the table.
	Name string
	// Key is the column that identifies a row. It must be unique: the
	// table's primary key, or a column with a unique index (not partial,
	// not deferrable) of its own. Check refuses the table otherwise,
	// because an update matching two rows would change both.
	Key string
	// FenceColumn records the newest fence written; default "fence". It must
	// be a 64-bit integer column (BIGINT; on SQLite a type with INTEGER
	// affinity); EnsureColumns adds it as a non-null BIGINT with default 0.
	FenceColumn string
	// OwnerColumn records the owner of that fence; default "fence_owner".
	// A text column compared byte for byte: on MySQL a binary type or a
	// _bin collation.
	OwnerColumn string
	// LeaseKeyColumn records the lease key the row's fence belongs to;
	// default "fence_key". Same requirements as OwnerColumn, and room for
	// limits.MaxKeyLen bytes. An empty value means the row is not bound yet:
	// the first write that applies binds it.
	LeaseKeyColumn string
	// LeaseKey, when set, returns the lease key whose holders may write the
	// row with key rowKey (for example "invoice:" + the invoice id). A token
	// for another key is refused with ErrWrongKey before anything is sent,
	// so even a row's first write cannot bind it to the wrong key. It must
	// be deterministic and safe for concurrent use.
	LeaseKey func(rowKey any) string
}

func validIdent(what, s string, allowSchema bool) error {
	parts := []string{s}
	if allowSchema {
		if strings.Count(s, ".") > 1 {
			return fmt.Errorf("%w: %s %q has more than one '.'", ErrSchema, what, s)
		}
		parts = strings.Split(s, ".")
	}
	for _, p := range parts {
		if err := sqlident.Check(what, p); err != nil {
			return fmt.Errorf("%w: %v", ErrSchema, err)
		}
	}
	return nil
}

// SQLOptions configure a SQL guard. nil gives the defaults.
type SQLOptions struct {
	// Hook receives an EventStaleWrite for every write refused as stale
	// (when nil, the hook of the client that issued the token).
	Hook func(fenced.Event)
	// Check, when set, must accept every token before it is compared (for
	// example a *Verifier for signed tokens, or a *Sequencer); a refusal is
	// returned as the error and nothing is sent.
	Check Checker
	// Timeout bounds how long a transaction that holds a guarded row's lock
	// may wait or sit idle, so that a paused holder cannot keep the row
	// locked past its lease; default DefaultTimeout (5 s). Keep it below a
	// third of the TTL of the leases whose tokens the guard checks. A lease
	// renewed every third of its TTL lasts at least two thirds of it after
	// its holder's last renewal. So a transaction of a holder paused mid-way
	// is ended before another holder can be granted the key.
	//
	// It bounds, as each database allows, three things. First, the whole of
	// ClaimAndRead: the lock wait, the read and the idle time. On PostgreSQL
	// that is lock_timeout, statement_timeout and
	// idle_in_transaction_session_timeout; on MySQL innodb_lock_wait_timeout
	// and wait_timeout, in whole seconds; on SQLite the busy timeout.
	// Second, each Claim or Update the guard runs itself (a nil Querier, or
	// a *sql.DB). Third, on PostgreSQL, the idle time of a caller's
	// transaction in which a Claim or Update applied. The guard sets
	// idle_in_transaction_session_timeout for the rest of that transaction,
	// unless it is already lower. Negative is an error.
	Timeout time.Duration
}

// Querier runs statements: *sql.DB, *sql.Tx and *sql.Conn all qualify. Pass
// the caller's transaction so the guard's statements commit or roll back
// with the caller's own writes.
type Querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Conn runs the guard's statements on a connection that is not a
// database/sql one, such as a native pgx transaction (package
// fence/pgxfence adapts pgx.Tx, *pgx.Conn and *pgxpool.Pool). Use it with
// UpdateConn, ClaimConn and CurrentConn.
type Conn interface {
	// Exec runs a statement and returns the number of rows it affected.
	Exec(ctx context.Context, query string, args ...any) (rowsAffected int64, err error)
	// QueryRow runs a query returning at most one row. Its Scan must return
	// an error matching sql.ErrNoRows when there is no row.
	QueryRow(ctx context.Context, query string, args ...any) Row
}

// Row is the result of Conn.QueryRow.
type Row interface {
	Scan(dest ...any) error
}

// sqlConn adapts a database/sql Querier to Conn.
type sqlConn struct{ q Querier }

func (c sqlConn) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := c.q.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("rows affected: %w", err)
	}
	return n, nil
}

func (c sqlConn) QueryRow(ctx context.Context, query string, args ...any) Row {
	return c.q.QueryRowContext(ctx, query, args...)
}

// conn returns q as a Conn, and whether the guard runs the statements on
// its own (no caller transaction): q is nil (the guard's *sql.DB) or a
// *sql.DB.
func (g *SQL) conn(q Querier) (c Conn, own bool) {
	switch q := q.(type) {
	case nil:
		return sqlConn{g.db}, true
	case *sql.DB:
		if q == nil {
			return sqlConn{g.db}, true
		}
		return sqlConn{q}, true
	}
	return sqlConn{q}, false
}

// SQL guards the rows of one table. Every write carries a Token and applies
// only if the row's recorded fence is not newer, recording the writer's
// fence, owner and lease key in the same statement.
//
// A row whose fence column holds F with owner O accepts a write from
// (fence, owner) when fence > F, or fence == F and owner == O. So the same
// holder may write many times with one fence. Every newer holder locks out
// every older one. An equal fence from a different owner (a repeated
// number after a failover of the fence source) is refused. A token for
// another lease key than the row's is refused with ErrWrongKey.
//
// # The safe sequence
//
// Claim the row and read the state it holds in one short transaction that
// commits (ClaimAndRead). Do the work outside any transaction. Then write
// with Update in a short transaction of its own (a nil Querier: one
// statement). Never hold a transaction open across the work. A holder
// paused inside it keeps the row locked. The next holder's claim waits
// behind it, and the paused holder's write then lands after its lease
// ended. See the package documentation for the whole worker.
//
// # Fragments
//
// Write.Set and Write.Where are SQL written by the program (never by its
// users). Each is placed on its own line of the statement. The guard
// refuses, with ErrInvalidWrite and before sending anything, a fragment
// that could change the statement's structure:
//
//   - comments (--, /*, and # on MySQL) and semicolons;
//   - brackets ( [ { that do not balance within the fragment;
//   - unterminated quotes, and backslashes anywhere (MySQL reads them as
//     escapes inside literals, the other dialects do not);
//   - dollar-quoted strings and $name parameters (PostgreSQL, SQLite),
//     ?NNN, :name and @name parameters (SQLite);
//   - placeholders that do not match the arguments: on SQLite and MySQL
//     the number of ? must equal len(SetArgs) (len(WhereArgs)); on
//     PostgreSQL, Set uses exactly $1..$len(SetArgs) and Where
//     $len(SetArgs)+1..$len(SetArgs)+len(WhereArgs), each at least once;
//     ? with PostgreSQL (and $n with the others) is explained as the other
//     dialect's placeholder;
//   - a Set that assigns the fence, owner or lease-key column.
//
// A fragment may contain column names, literals in single quotes, quoted
// identifiers, operators, function calls, CASE expressions and sub-queries
// in brackets. Values belong in the arguments.
//
// SQL is safe for concurrent use.
type SQL struct {
	db      *sql.DB
	dialect Dialect
	table   Table
	hook    func(fenced.Event)
	check   Checker
	timeout time.Duration
	// checked is set once the table's shape was found right (by Check,
	// EnsureColumns or a first write).
	checked atomic.Bool

	qTable, qKey, qFence, qOwner, qLeaseKey string
}

// NewSQL returns a guard for table t in db. It checks the identifiers but
// does not touch the database. Call EnsureColumns once at start-up (or
// Check, if the columns are managed by migrations). In any case the first
// write checks the table's shape (see Check) and refuses to write to a
// table that fails it. opts may be nil.
func NewSQL(db *sql.DB, d Dialect, t Table, opts *SQLOptions) (*SQL, error) {
	if db == nil {
		return nil, errors.New("fence: NewSQL: db is nil")
	}
	if d != SQLite && d != Postgres && d != MySQL {
		return nil, fmt.Errorf("fence: NewSQL: unknown dialect %v", d)
	}
	if t.FenceColumn == "" {
		t.FenceColumn = DefaultFenceColumn
	}
	if t.OwnerColumn == "" {
		t.OwnerColumn = DefaultOwnerColumn
	}
	if t.LeaseKeyColumn == "" {
		t.LeaseKeyColumn = DefaultLeaseKeyColumn
	}
	if err := validIdent("table", t.Name, true); err != nil {
		return nil, fmt.Errorf("fence: NewSQL: %w", err)
	}
	cols := [][2]string{{"key column", t.Key}, {"fence column", t.FenceColumn}, {"owner column", t.OwnerColumn},
		{"lease key column", t.LeaseKeyColumn}}
	for i, c := range cols {
		if err := validIdent(c[0], c[1], false); err != nil {
			return nil, fmt.Errorf("fence: NewSQL: %w", err)
		}
		for _, o := range cols[:i] {
			if strings.EqualFold(c[1], o[1]) {
				return nil, fmt.Errorf("fence: NewSQL: %w: %s and %s are both %q; key, fence, owner and lease key columns must be distinct",
					ErrSchema, o[0], c[0], c[1])
			}
		}
	}
	g := &SQL{db: db, dialect: d, table: t, timeout: DefaultTimeout}
	if opts != nil {
		g.hook, g.check = opts.Hook, opts.Check
		switch {
		case opts.Timeout < 0:
			return nil, fmt.Errorf("fence: NewSQL: Timeout %v is negative", opts.Timeout)
		case opts.Timeout > 0:
			g.timeout = opts.Timeout
		}
	}
	g.qTable = d.quote(t.Name)
	g.qKey = d.quote(t.Key)
	g.qFence = d.quote(t.FenceColumn)
	g.qOwner = d.quote(t.OwnerColumn)
	g.qLeaseKey = d.quote(t.LeaseKeyColumn)
	return g, nil
}

// Table returns the guarded table's description, with defaults filled in.
func (g *SQL) Table() Table { return g.table }

// Dialect returns the guard's dialect.
func (g *SQL) Dialect() Dialect { return g.dialect }

// Timeout returns the guard's effective SQLOptions.Timeout.
func (g *SQL) Timeout() time.Duration { return g.timeout }

// Write describes a guarded update: the assignments to make and the row's
// own precondition. Both are SQL fragments written by the program, never by
// its users; values go in the argument lists. What a fragment may contain
// is listed in the SQL type's documentation. Anything else is refused with
// ErrInvalidWrite before the statement is sent.
//
// Placeholders: with SQLite and MySQL use ?, with the arguments of Set
// first, then those of Where. With PostgreSQL number them across both
// fragments: Set uses $1..$len(SetArgs) and Where continues from
// $len(SetArgs)+1. The guard appends its own parameters after them.
//
// Set must not assign the fence, owner or lease-key columns; the guard
// does.
type Write struct {
	// Set is the assignment list, for example "status = ?, sent_at = ?".
	// Empty means: only record the fence (a claim).
	Set     string
	SetArgs []any
	// Where is the row's precondition, for example "status = ?". Empty
	// means none. When it does not hold the result is PreconditionFailed.
	Where     string
	WhereArgs []any
}

// Claim records t's fence on the row identified by key before the holder
// does anything else. Then a stale holder's write that arrives later is
// refused even if the new holder has not written yet.
//
// Prefer ClaimAndRead, which claims and reads the inherited state in a short
// transaction of its own and commits. Claim is the building block. With a
// nil q it is one statement of its own. With the caller's transaction, the
// claim takes the row's lock until that transaction ends. So commit it
// before doing the work: never claim, work and update in one transaction
// (see SQL).
//
// Claim applies when the row's fence is older than t's, or equal with the
// same owner (claiming twice is harmless). It returns Stale when a newer
// holder has claimed or written the row. Errors, with nothing changed.
// ErrNoRow for a missing row, ErrInvalidToken for a bad token, ErrWrongKey
// when the row is bound to another lease key, ErrSchema when the table's
// shape is wrong (see Check).
func (g *SQL) Claim(ctx context.Context, q Querier, key any, t Token) (Result, error) {
	c, own := g.conn(q)
	return g.write(ctx, "claim", c, own, key, t, Write{})
}

// ClaimConn is Claim on a Conn, which is treated as the caller's
// transaction: the guard sets no deadline of its own on it.
func (g *SQL) ClaimConn(ctx context.Context, c Conn, key any, t Token) (Result, error) {
	return g.write(ctx, "claim", c, false, key, t, Write{})
}

// Update applies w to the row identified by key if the row's fence admits t
// (see SQL) and w.Where holds, recording t's fence, owner and key in the
// same statement. One statement on success; on refusal one more read in
// the same transaction tells Stale from PreconditionFailed, so the caller
// need not re-read.
//
// q is the caller's transaction, or nil to let the guard run the statement
// on its own *sql.DB within its Timeout (the usual choice after
// ClaimAndRead). Errors, with nothing changed. ErrInvalidToken for a bad
// token, ErrWrongKey for a token of another lease key, ErrInvalidWrite for
// a fragment or argument list the guard refuses, ErrNoRow when the row does
// not exist, ErrSchema when the table's shape is wrong. A Stale result is
// also reported to the Hook.
func (g *SQL) Update(ctx context.Context, q Querier, key any, t Token, w Write) (Result, error) {
	c, own := g.conn(q)
	return g.write(ctx, "update", c, own, key, t, w)
}

// UpdateConn is Update on a Conn, which is treated as the caller's
// transaction: the guard sets no deadline of its own on it. c must not be
// nil.
func (g *SQL) UpdateConn(ctx context.Context, c Conn, key any, t Token, w Write) (Result, error) {
	return g.write(ctx, "update", c, false, key, t, w)
}

// validateToken checks t and, when Table.LeaseKey is set, its lease key
// for the row with key rowKey, without asking anyone.
func (g *SQL) validateToken(rowKey any, t Token) error {
	if err := t.Validate(); err != nil {
		return err
	}
	if rowKey == nil {
		return errors.New("row key is nil")
	}
	if g.table.LeaseKey != nil {
		bound := g.table.LeaseKey(rowKey)
		if bound == "" {
			return fmt.Errorf("Table.LeaseKey returned an empty lease key for row %v", rowKey)
		}
		if err := checkKey(bound, t.Key); err != nil {
			return fmt.Errorf("row %v: %w", rowKey, err)
		}
	}
	return nil
}

// write runs a guarded update (a claim when w is empty) on c. own is true
// when c is not a caller's transaction.
func (g *SQL) write(ctx context.Context, op string, c Conn, own bool, key any, t Token, w Write) (Result, error) {
	if c == nil {
		return Result{}, fmt.Errorf("fence: %s %s: Conn is nil", op, g.table.Name)
	}
	if err := g.validateToken(key, t); err != nil {
		return Result{}, fmt.Errorf("fence: %s %s: %w", op, g.table.Name, err)
	}
	if g.check != nil {
		if err := g.check.Check(ctx, t); err != nil {
			return Result{}, fmt.Errorf("fence: %s %s: %w", op, g.table.Name, err)
		}
	}
	if err := g.checkWrite(w); err != nil {
		return Result{}, fmt.Errorf("fence: %s %s: %w", op, g.table.Name, err)
	}
	if own {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, g.timeout)
		defer cancel()
	}
	if err := g.ready(ctx, c); err != nil {
		return Result{}, fmt.Errorf("fence: %s %s: %w", op, g.table.Name, err)
	}
	query, args := g.updateStatement(key, t, w)
	affected, err := c.Exec(ctx, query, args...)
	if err != nil {
		return Result{}, g.explain(ctx, c, own, op, err)
	}
	if affected > 1 {
		// The shape check makes this impossible unless the key's unique
		// index was dropped since.
		g.checked.Store(false)
		return Result{}, fmt.Errorf("fence: %s %s: %w: %d rows matched key %v; the key column must be unique (roll the transaction back)",
			op, g.table.Name, ErrSchema, affected, key)
	}
	if affected == 1 {
		return Result{Outcome: Applied, Current: t.Fence, Presented: t.Fence}, nil
	}

	// Nothing applied: find out why, inside the same transaction. On
	// PostgreSQL a plain read is consistent with the UPDATE (under READ
	// COMMITTED both see the newest committed row; under REPEATABLE READ
	// both see the snapshot, and a conflicting newer version would have
	// failed the UPDATE). MySQL's UPDATE reads the newest row but its plain
	// SELECT reads an older snapshot, so there the read locks the row.
	cur, err := g.read(ctx, c, own, key, w, true)
	if err != nil {
		return Result{}, err
	}
	if cur.leaseKey != "" && cur.leaseKey != t.Key {
		return Result{}, fmt.Errorf("fence: %s %s: row %v (its fence %d belongs to that key): %w",
			op, g.table.Name, key, cur.fence, checkKey(cur.leaseKey, t.Key))
	}
	r := classify(t, cur.fence, cur.owner)
	if r.Outcome == PreconditionFailed && g.dialect == MySQL && cur.fence == t.Fence && cur.precond {
		// MySQL counts changed rows, not matched ones: the statement matched
		// but every value was already what it wrote.
		return Result{Outcome: Applied, Current: t.Fence, Presented: t.Fence}, nil
	}
	report(g.hook, t, r, g.table.Name)
	return r, nil
}

// updateStatement builds the guarded UPDATE for w. Each fragment stands on
// its own line, so that even a comment the fragment scanner missed could
// only reach the end of its own line.
func (g *SQL) updateStatement(key any, t Token, w Write) (string, []any) {
	d := g.dialect
	set, where := strings.TrimSpace(w.Set), strings.TrimSpace(w.Where)
	fence, owner := int64(t.Fence), t.Owner
	var b strings.Builder
	var args []any
	fmt.Fprintf(&b, "UPDATE %s SET\n", g.qTable)
	if set != "" {
		b.WriteString(w.Set + "\n, ")
	}
	if d == Postgres {
		// User placeholders are $1..$len(SetArgs)+len(WhereArgs); ours follow.
		n := len(w.SetArgs) + len(w.WhereArgs)
		pF, pO, pK, pR, pIdle := d.placeholder(n+1), d.placeholder(n+2), d.placeholder(n+3), d.placeholder(n+4), d.placeholder(n+5)
		args = append(append(args, w.SetArgs...), w.WhereArgs...)
		args = append(args, fence, owner, t.Key, key, g.timeout.Milliseconds())
		fmt.Fprintf(&b,
			"%s = %s, %s = %s, %s = %s\nWHERE %s = %s AND COALESCE(%s, 0) >= 0\n"+
				"AND (COALESCE(%s, 0) < %s OR (%s = %s AND %s))\nAND (COALESCE(%s, '') = '' OR %s)",
			g.qFence, pF, g.qOwner, pO, g.qLeaseKey, pK,
			g.qKey, pR, g.qFence,
			g.qFence, pF, g.qFence, pF, d.sameBytes(g.qOwner, pO),
			g.qLeaseKey, d.sameBytes(g.qLeaseKey, pK))
		if where != "" {
			b.WriteString("\nAND (\n" + w.Where + "\n)")
		}
		// A transaction in which the update applied holds the row's lock:
		// it may not sit idle past the guard's timeout (unless the caller
		// already set a lower limit).
		fmt.Fprintf(&b,
			"\nRETURNING set_config('idle_in_transaction_session_timeout', "+
				"CASE WHEN EXTRACT(EPOCH FROM current_setting('idle_in_transaction_session_timeout')::interval) * 1000 "+
				"BETWEEN 1 AND %[1]s::bigint "+
				"THEN current_setting('idle_in_transaction_session_timeout') ELSE %[1]s::bigint::text END, true)", pIdle)
		return b.String(), args
	}
	args = append(args, w.SetArgs...)
	fmt.Fprintf(&b,
		"%s = ?, %s = ?, %s = ?\nWHERE %s = ? AND COALESCE(%s, 0) >= 0\n"+
			"AND (COALESCE(%s, 0) < ? OR (%s = ? AND %s))\nAND (COALESCE(%s, '') = '' OR %s)",
		g.qFence, g.qOwner, g.qLeaseKey,
		g.qKey, g.qFence,
		g.qFence, g.qFence, d.sameBytes(g.qOwner, "?"),
		g.qLeaseKey, d.sameBytes(g.qLeaseKey, "?"))
	args = append(args, fence, owner, t.Key, key, fence, fence, owner, t.Key)
	if where != "" {
		b.WriteString("\nAND (\n" + w.Where + "\n)")
		args = append(args, w.WhereArgs...)
	}
	return b.String(), args
}

// rowState is what a guarded row records.
type rowState struct {
	fence    uint64
	owner    string
	leaseKey string
	// precond is whether the write's Where holds (read on MySQL only;
	// true elsewhere).
	precond bool
}

// read returns the row's fence, owner and lease key and, on MySQL, whether
// w's precondition holds. lock makes the read a locking one on MySQL.
func (g *SQL) read(ctx context.Context, c Conn, own bool, key any, w Write, lock bool) (rowState, error) {
	var (
		st   rowState
		f    int64
		cond int64 = 1
		dest       = []any{&f, &st.owner, &st.leaseKey}
		args []any
		b    strings.Builder
	)
	fmt.Fprintf(&b, "SELECT COALESCE(%s, 0), COALESCE(%s, ''), COALESCE(%s, '')", g.qFence, g.qOwner, g.qLeaseKey)
	if g.dialect == MySQL && strings.TrimSpace(w.Where) != "" {
		fmt.Fprintf(&b, ", CASE WHEN (\n%s\n) THEN 1 ELSE 0 END\n", w.Where)
		args = append(args, w.WhereArgs...)
		dest = append(dest, &cond)
	}
	fmt.Fprintf(&b, " FROM %s WHERE %s = %s", g.qTable, g.qKey, g.dialect.placeholder(1))
	args = append(args, key)
	if lock && g.dialect == MySQL {
		b.WriteString(" FOR UPDATE")
	}
	err := c.QueryRow(ctx, b.String(), args...).Scan(dest...)
	if errors.Is(err, sql.ErrNoRows) {
		return rowState{}, fmt.Errorf("fence: %s: %w: %s = %v", g.table.Name, ErrNoRow, g.table.Key, key)
	}
	if err != nil {
		return rowState{}, g.explain(ctx, c, own, "read", err)
	}
	if f < 0 {
		return rowState{}, fmt.Errorf("fence: %s: %w: row %v has negative fence %d (not written by a guard)",
			g.table.Name, ErrSchema, key, f)
	}
	st.fence, st.precond = uint64(f), cond == 1
	return st, nil
}

// Current returns the fence and owner recorded on the row identified by key.
// A missing row is an error matching ErrNoRow.
func (g *SQL) Current(ctx context.Context, q Querier, key any) (fence uint64, owner string, err error) {
	c, own := g.conn(q)
	st, err := g.read(ctx, c, own, key, Write{}, false)
	return st.fence, st.owner, err
}

// CurrentConn is Current on a Conn.
func (g *SQL) CurrentConn(ctx context.Context, c Conn, key any) (fence uint64, owner string, err error) {
	st, err := g.read(ctx, c, false, key, Write{}, false)
	return st.fence, st.owner, err
}

// explain wraps a database error, naming a missing table or column when
// that is the cause. It checks on c unless c is a caller's PostgreSQL
// transaction, which the error has aborted; then it uses the guard's pool.
func (g *SQL) explain(ctx context.Context, c Conn, own bool, op string, err error) error {
	if ctx.Err() == nil {
		on := c
		if g.dialect == Postgres && !own {
			on = sqlConn{g.db}
		}
		if _, cerr := g.inspect(ctx, on); errors.Is(cerr, ErrSchema) {
			g.checked.Store(false)
			return fmt.Errorf("fence: %s %s: %w (database said: %v)", op, g.table.Name, cerr, err)
		}
	}
	return fmt.Errorf("fence: %s %s: %w", op, g.table.Name, err)
}
