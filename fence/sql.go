package fence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/sqlident"
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

// Default column names added by EnsureColumns.
const (
	DefaultFenceColumn = "fence"
	DefaultOwnerColumn = "fence_owner"
)

// Table names a guarded table and its columns. Identifiers must match
// [A-Za-z_][A-Za-z0-9_]* (at most 63 bytes); Name may carry one schema
// prefix ("billing.invoice_jobs"). They are quoted, so they are matched with
// the exact spelling the database stores (PostgreSQL folds unquoted names to
// lower case when a table is created).
type Table struct {
	// Name is the table.
	Name string
	// Key is the column that identifies a row: a primary key or a unique
	// column. (If a key matched several rows, an autocommitted Update would
	// change them all before reporting the error.)
	Key string
	// FenceColumn records the newest fence written; default "fence". It must
	// be an integer column; EnsureColumns adds it as a non-null BIGINT with
	// default 0.
	FenceColumn string
	// OwnerColumn records the owner of that fence; default "fence_owner".
	OwnerColumn string
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
	// Hooks receive a StaleWrite event for every write refused as stale.
	// Typically client.Hooks() of the fenced.Client issuing the leases.
	Hooks fenced.Hooks
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

func (g *SQL) conn(q Querier) Conn {
	if q == nil {
		return sqlConn{g.db}
	}
	return sqlConn{q}
}

// SQL guards the rows of one table: every write carries a Token and applies
// only if the row's recorded fence is not newer, recording the writer's fence
// and owner in the same statement.
//
// A row whose fence column holds F with owner O accepts a write from
// (fence, owner) when fence > F, or fence == F and owner == O. So the same
// holder may write many times with one fence, every newer holder locks out
// every older one, and an equal fence from a different owner (a repeated
// number after a failover of the fence source) is refused.
//
// SQL is safe for concurrent use.
type SQL struct {
	db      *sql.DB
	dialect Dialect
	table   Table
	hooks   fenced.Hooks

	qTable, qKey, qFence, qOwner string
}

// NewSQL returns a guard for table t in db. It checks the identifiers but
// does not touch the database; call EnsureColumns once at start-up (or Check,
// if the columns are managed by migrations). opts may be nil.
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
	if err := validIdent("table", t.Name, true); err != nil {
		return nil, fmt.Errorf("fence: NewSQL: %w", err)
	}
	for _, c := range [][2]string{{"key column", t.Key}, {"fence column", t.FenceColumn}, {"owner column", t.OwnerColumn}} {
		if err := validIdent(c[0], c[1], false); err != nil {
			return nil, fmt.Errorf("fence: NewSQL: %w", err)
		}
	}
	if strings.EqualFold(t.FenceColumn, t.OwnerColumn) || strings.EqualFold(t.Key, t.FenceColumn) || strings.EqualFold(t.Key, t.OwnerColumn) {
		return nil, fmt.Errorf("fence: NewSQL: %w: key, fence and owner columns must be distinct", ErrSchema)
	}
	g := &SQL{db: db, dialect: d, table: t}
	if opts != nil {
		g.hooks = opts.Hooks
	}
	g.qTable = d.quote(t.Name)
	g.qKey = d.quote(t.Key)
	g.qFence = d.quote(t.FenceColumn)
	g.qOwner = d.quote(t.OwnerColumn)
	return g, nil
}

// Table returns the guarded table's description, with defaults filled in.
func (g *SQL) Table() Table { return g.table }

// Dialect returns the guard's dialect.
func (g *SQL) Dialect() Dialect { return g.dialect }

// columns returns the table's column names (lower-cased except on
// PostgreSQL, where quoted names are case-sensitive); exists is false when
// the table does not exist.
func (g *SQL) columns(ctx context.Context) (cols map[string]bool, exists bool, err error) {
	schema, name := "", g.table.Name
	if i := strings.IndexByte(name, '.'); i >= 0 {
		schema, name = name[:i], name[i+1:]
	}
	var rows *sql.Rows
	switch g.dialect {
	case SQLite:
		if schema == "" {
			schema = "main"
		}
		rows, err = g.db.QueryContext(ctx, `SELECT name FROM pragma_table_info(?, ?)`, name, schema)
	case Postgres:
		rows, err = g.db.QueryContext(ctx, `SELECT attname FROM pg_attribute WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped`, g.qTable)
	case MySQL:
		var s any
		if schema != "" {
			s = schema
		}
		rows, err = g.db.QueryContext(ctx, `SELECT column_name FROM information_schema.columns WHERE table_schema = COALESCE(?, DATABASE()) AND table_name = ?`, s, name)
	}
	if err != nil {
		return nil, false, fmt.Errorf("fence: read columns of %s: %w", g.table.Name, err)
	}
	defer rows.Close()
	cols = map[string]bool{}
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			return nil, false, fmt.Errorf("fence: read columns of %s: %w", g.table.Name, err)
		}
		cols[g.fold(c)] = true
	}
	if err := rows.Err(); err != nil {
		return nil, false, fmt.Errorf("fence: read columns of %s: %w", g.table.Name, err)
	}
	return cols, len(cols) > 0, nil
}

func (g *SQL) fold(ident string) string {
	if g.dialect == Postgres {
		return ident
	}
	return strings.ToLower(ident)
}

// Check verifies that the table and its key, fence and owner columns exist.
// Errors match ErrSchema and name what is missing.
func (g *SQL) Check(ctx context.Context) error {
	cols, exists, err := g.columns(ctx)
	if err != nil {
		return err
	}
	if !exists {
		return fmt.Errorf("%w: table %s does not exist", ErrSchema, g.table.Name)
	}
	var missing []string
	for _, c := range []string{g.table.Key, g.table.FenceColumn, g.table.OwnerColumn} {
		if !cols[g.fold(c)] {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: table %s has no column %s (EnsureColumns adds the fence and owner columns)", ErrSchema, g.table.Name, strings.Join(missing, ", "))
	}
	return nil
}

// EnsureColumns adds the fence column (BIGINT NOT NULL DEFAULT 0, never
// negative) and the owner column (text, NOT NULL DEFAULT ”) to the table if
// they are missing. It does not create the table: a missing table or key
// column is an error matching ErrSchema, and nothing is changed. Running it
// concurrently from several processes is safe.
func (g *SQL) EnsureColumns(ctx context.Context) error {
	cols, exists, err := g.columns(ctx)
	if err != nil {
		return err
	}
	if !exists {
		return fmt.Errorf("fence: ensure columns: %w: table %s does not exist", ErrSchema, g.table.Name)
	}
	if !cols[g.fold(g.table.Key)] {
		return fmt.Errorf("fence: ensure columns: %w: table %s has no key column %s", ErrSchema, g.table.Name, g.table.Key)
	}
	var fenceType, ownerType string
	switch g.dialect {
	case SQLite:
		fenceType, ownerType = "INTEGER", "TEXT"
	case Postgres:
		fenceType, ownerType = "bigint", "text"
	case MySQL:
		fenceType, ownerType = "BIGINT", fmt.Sprintf("VARCHAR(%d)", MaxOwnerLen)
	}
	add := func(col, def string) error {
		if cols[g.fold(col)] {
			return nil
		}
		q := fmt.Sprintf("ALTER TABLE %s ADD COLUMN %s %s", g.qTable, g.dialect.quote(col), def)
		if _, err := g.db.ExecContext(ctx, q); err != nil {
			// Another process may have added it meanwhile.
			if again, _, cerr := g.columns(ctx); cerr == nil && again[g.fold(col)] {
				return nil
			}
			return fmt.Errorf("fence: ensure columns: add %s to %s: %w", col, g.table.Name, err)
		}
		return nil
	}
	if err := add(g.table.FenceColumn, fmt.Sprintf("%s NOT NULL DEFAULT 0 CHECK (%s >= 0)", fenceType, g.qFence)); err != nil {
		return err
	}
	return add(g.table.OwnerColumn, ownerType+" NOT NULL DEFAULT ''")
}

// Write describes a guarded update: the assignments to make and the row's
// own precondition. Both are SQL fragments written by the program, never by
// its users; values go in the argument lists.
//
// Placeholders: with SQLite and MySQL use ?, with the arguments of Set
// first, then those of Where. With PostgreSQL number them across both
// fragments: Set uses $1..$len(SetArgs) and Where continues from
// $len(SetArgs)+1. The guard appends its own parameters after them.
//
// Set must not assign the fence or owner columns; the guard does.
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
// does anything else, so that a stale holder's write that arrives later is
// refused even if the new holder has not written yet. Call it first thing
// after acquiring the lease, in the same transaction as the read of the state
// the holder inherits (read after the claim; the claim's row lock, or
// SQLite's write lock, keeps the state from changing underneath).
//
// Claim applies when the row's fence is older than t's, or equal with the
// same owner (claiming twice is harmless). It returns Stale when a newer
// holder has claimed or written the row. A missing row is an error matching
// ErrNoRow; a bad token, ErrInvalidToken. Nothing is changed in either case.
func (g *SQL) Claim(ctx context.Context, q Querier, key any, t Token) (Result, error) {
	return g.UpdateConn(ctx, g.conn(q), key, t, Write{})
}

// ClaimConn is Claim on a Conn.
func (g *SQL) ClaimConn(ctx context.Context, c Conn, key any, t Token) (Result, error) {
	return g.UpdateConn(ctx, c, key, t, Write{})
}

// Update applies w to the row identified by key if the row's fence admits t
// (see SQL) and w.Where holds, recording t's fence and owner in the same
// statement. One statement on success; on refusal one more read in the same
// transaction tells Stale from PreconditionFailed, so the caller need not
// re-read.
//
// q is normally the caller's *sql.Tx; nil means the guard's *sql.DB. Errors:
// ErrInvalidToken for a bad token, ErrNoRow when the row does not exist,
// ErrSchema when the table or a column is missing; nothing is changed in
// any of these cases. A Stale result is also reported to the Hooks.
func (g *SQL) Update(ctx context.Context, q Querier, key any, t Token, w Write) (Result, error) {
	return g.UpdateConn(ctx, g.conn(q), key, t, w)
}

// UpdateConn is Update on a Conn. c must not be nil.
func (g *SQL) UpdateConn(ctx context.Context, q Conn, key any, t Token, w Write) (Result, error) {
	if q == nil {
		return Result{}, fmt.Errorf("fence: update %s: Conn is nil", g.table.Name)
	}
	if err := t.Validate(); err != nil {
		return Result{}, fmt.Errorf("fence: update %s: %w", g.table.Name, err)
	}
	if key == nil {
		return Result{}, fmt.Errorf("fence: update %s: row key is nil", g.table.Name)
	}
	if strings.TrimSpace(w.Set) == "" && len(w.SetArgs) > 0 {
		return Result{}, fmt.Errorf("fence: update %s: SetArgs given without Set", g.table.Name)
	}
	if strings.TrimSpace(w.Where) == "" && len(w.WhereArgs) > 0 {
		return Result{}, fmt.Errorf("fence: update %s: WhereArgs given without Where", g.table.Name)
	}
	fence, owner := int64(t.Fence), t.Owner

	var b strings.Builder
	var args []any
	n := 0
	next := func() string { n++; return g.dialect.placeholder(n) }
	fmt.Fprintf(&b, "UPDATE %s SET ", g.qTable)
	var pFence, pOwner, pKey string
	if g.dialect == Postgres {
		// User placeholders are $1..$len(SetArgs)+len(WhereArgs); ours follow.
		n = len(w.SetArgs) + len(w.WhereArgs)
		args = append(append(args, w.SetArgs...), w.WhereArgs...)
		pFence, pOwner, pKey = next(), next(), next()
		args = append(args, fence, owner, key)
		if strings.TrimSpace(w.Set) != "" {
			b.WriteString(w.Set + ", ")
		}
		fmt.Fprintf(&b, "%s = %s, %s = %s WHERE %s = %s AND COALESCE(%s, 0) >= 0 AND (COALESCE(%s, 0) < %s OR (%s = %s AND %s = %s))",
			g.qFence, pFence, g.qOwner, pOwner, g.qKey, pKey, g.qFence, g.qFence, pFence, g.qFence, pFence, g.qOwner, pOwner)
	} else {
		if strings.TrimSpace(w.Set) != "" {
			b.WriteString(w.Set + ", ")
			args = append(args, w.SetArgs...)
		}
		fmt.Fprintf(&b, "%s = ?, %s = ? WHERE %s = ? AND COALESCE(%s, 0) >= 0 AND (COALESCE(%s, 0) < ? OR (%s = ? AND %s = ?))",
			g.qFence, g.qOwner, g.qKey, g.qFence, g.qFence, g.qFence, g.qOwner)
		args = append(args, fence, owner, key, fence, fence, owner)
	}
	if strings.TrimSpace(w.Where) != "" {
		fmt.Fprintf(&b, " AND (%s)", w.Where)
		if g.dialect != Postgres {
			args = append(args, w.WhereArgs...)
		}
	}
	affected, err := q.Exec(ctx, b.String(), args...)
	if err != nil {
		return Result{}, g.explain(ctx, "update", err)
	}
	if affected > 1 {
		return Result{}, fmt.Errorf("fence: update %s: %d rows matched key %v; the key column must be unique (the transaction should be rolled back)", g.table.Name, affected, key)
	}
	if affected == 1 {
		return Result{Outcome: Applied, Current: t.Fence}, nil
	}

	// Nothing applied: find out why, inside the same transaction. On
	// PostgreSQL a plain read is consistent with the UPDATE (under READ
	// COMMITTED both see the newest committed row; under REPEATABLE READ
	// both see the snapshot, and a conflicting newer version would have
	// failed the UPDATE). MySQL's UPDATE reads the newest row but its plain
	// SELECT reads an older snapshot, so there the read locks the row.
	cur, curOwner, precond, err := g.read(ctx, q, key, w)
	if err != nil {
		return Result{}, err
	}
	r := classify(t, cur, curOwner)
	if r.Outcome == PreconditionFailed && g.dialect == MySQL && cur == t.Fence && precond {
		// MySQL counts changed rows, not matched ones: the statement matched
		// but every value was already what it wrote.
		return Result{Outcome: Applied, Current: t.Fence}, nil
	}
	report(g.hooks, t, r, g.table.Name)
	return r, nil
}

// read returns the row's fence and owner and, on MySQL, whether w's
// precondition holds.
func (g *SQL) read(ctx context.Context, q Conn, key any, w Write) (fence uint64, owner string, precond bool, err error) {
	var (
		f    int64
		cond int64
		dest = []any{&f, &owner}
		args []any
		b    strings.Builder
	)
	fmt.Fprintf(&b, "SELECT COALESCE(%s, 0), COALESCE(%s, '')", g.qFence, g.qOwner)
	if g.dialect == MySQL && strings.TrimSpace(w.Where) != "" {
		fmt.Fprintf(&b, ", CASE WHEN (%s) THEN 1 ELSE 0 END", w.Where)
		args = append(args, w.WhereArgs...)
		dest = append(dest, &cond)
	} else {
		cond = 1
	}
	fmt.Fprintf(&b, " FROM %s WHERE %s = %s", g.qTable, g.qKey, g.dialect.placeholder(1))
	args = append(args, key)
	if g.dialect == MySQL {
		b.WriteString(" FOR UPDATE")
	}
	err = q.QueryRow(ctx, b.String(), args...).Scan(dest...)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, "", false, fmt.Errorf("fence: %s: %w: %s = %v", g.table.Name, ErrNoRow, g.table.Key, key)
	}
	if err != nil {
		return 0, "", false, g.explain(ctx, "read", err)
	}
	if f < 0 {
		return 0, "", false, fmt.Errorf("fence: %s: %w: row %v has negative fence %d (not written by a guard)", g.table.Name, ErrSchema, key, f)
	}
	return uint64(f), owner, cond == 1, nil
}

// Current returns the fence and owner recorded on the row identified by key.
// A missing row is an error matching ErrNoRow.
func (g *SQL) Current(ctx context.Context, q Querier, key any) (fence uint64, owner string, err error) {
	return g.CurrentConn(ctx, g.conn(q), key)
}

// CurrentConn is Current on a Conn.
func (g *SQL) CurrentConn(ctx context.Context, q Conn, key any) (fence uint64, owner string, err error) {
	var f int64
	err = q.QueryRow(ctx, fmt.Sprintf("SELECT COALESCE(%s, 0), COALESCE(%s, '') FROM %s WHERE %s = %s",
		g.qFence, g.qOwner, g.qTable, g.qKey, g.dialect.placeholder(1)), key).Scan(&f, &owner)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, "", fmt.Errorf("fence: %s: %w: %s = %v", g.table.Name, ErrNoRow, g.table.Key, key)
	}
	if err != nil {
		return 0, "", g.explain(ctx, "read", err)
	}
	if f < 0 {
		return 0, "", fmt.Errorf("fence: %s: %w: row %v has negative fence %d", g.table.Name, ErrSchema, key, f)
	}
	return uint64(f), owner, nil
}

// explain wraps a database error, naming a missing table or column when
// that is the cause (checked on the guard's own pool, since the caller's
// transaction may be aborted).
func (g *SQL) explain(ctx context.Context, op string, err error) error {
	if ctx.Err() == nil {
		if cerr := g.Check(ctx); errors.Is(cerr, ErrSchema) {
			return fmt.Errorf("fence: %s %s: %w (database said: %v)", op, g.table.Name, cerr, err)
		}
	}
	return fmt.Errorf("fence: %s %s: %w", op, g.table.Name, err)
}
