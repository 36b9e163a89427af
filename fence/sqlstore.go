package fence

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
)

// DefaultStoreTable is the table a SQLStore keeps its fences in when
// SQLStoreOptions.Table is empty.
const DefaultStoreTable = "fenced_http_fences"

// SQLStore is a durable Store for Middleware. The newest fence and owner of
// each lease key are rows of a table in SQLite or PostgreSQL. So a restart
// of the resource forgets nothing, and keys are not bounded by memory. The
// row is raised in its own committed statement when a token is admitted,
// before the handler runs. So an admission is never lost even if the process
// dies during the handler.
//
// Admission and write stay atomic together: the key is held while the
// handler runs. So an older write never runs after (or beside) a newer one.
// Within one process this always holds. Across processes it holds on
// PostgreSQL, through a transaction-scoped advisory lock held on a pooled
// connection for the handler's duration. That is safe behind PgBouncer in
// transaction mode. A PostgreSQL idle_in_transaction_session_timeout shorter
// than your handlers would end that lock early. On SQLite the key is held
// within one process only. Serve a SQLite-backed resource from one process,
// or have the handler record the fence with its own write (a SQL guard).
//
// Open SQLite databases with a busy timeout (for example
// "_pragma=busy_timeout(10000)" with modernc.org/sqlite), since admissions
// of different keys write concurrently.
type SQLStore struct {
	db     *sql.DB
	d      Dialect
	table  string // as given, for messages and lock ids
	upsert string
	read   string
	locks  keyLocks
}

// SQLStoreOptions configure a SQLStore. nil gives the defaults.
type SQLStoreOptions struct {
	// Table names the table, optionally with one schema prefix; default
	// DefaultStoreTable. OpenSQLStore creates it when missing and checks
	// its shape otherwise: columns lease_key (text, the primary key), fence
	// (a 64-bit integer) and owner (text).
	Table string
}

// OpenSQLStore returns a SQLStore on db, creating its table if it does not
// exist and checking its shape if it does. An error matching ErrSchema
// names what is wrong and changes nothing. d must be SQLite or Postgres.
// opts may be nil.
func OpenSQLStore(ctx context.Context, db *sql.DB, d Dialect, opts *SQLStoreOptions) (*SQLStore, error) {
	if db == nil {
		return nil, errors.New("fence: OpenSQLStore: db is nil")
	}
	if d != SQLite && d != Postgres {
		return nil, fmt.Errorf("fence: OpenSQLStore: dialect %v is not supported (want %v or %v)", d, SQLite, Postgres)
	}
	s := &SQLStore{db: db, d: d, table: DefaultStoreTable}
	if opts != nil && opts.Table != "" {
		s.table = opts.Table
	}
	if err := validIdent("table", s.table, true); err != nil {
		return nil, fmt.Errorf("fence: OpenSQLStore: %w", err)
	}
	q := d.quote(s.table)
	s.upsert = fmt.Sprintf(`INSERT INTO %s AS cur (lease_key, fence, owner) VALUES (%s, %s, %s)
ON CONFLICT (lease_key) DO UPDATE SET fence = excluded.fence, owner = excluded.owner
WHERE cur.fence < excluded.fence OR (cur.fence = excluded.fence AND cur.owner = excluded.owner)
RETURNING fence, owner`, q, d.placeholder(1), d.placeholder(2), d.placeholder(3))
	s.read = fmt.Sprintf(`SELECT fence, owner FROM %s WHERE lease_key = %s`, q, d.placeholder(1))
	if err := s.ensureTable(ctx); err != nil {
		return nil, fmt.Errorf("fence: OpenSQLStore %s: %w", s.table, err)
	}
	return s, nil
}

func (s *SQLStore) ensureTable(ctx context.Context) error {
	q := s.d.quote(s.table)
	if s.d == SQLite {
		if _, err := s.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+q+` (
	lease_key TEXT NOT NULL PRIMARY KEY,
	fence INTEGER NOT NULL CHECK (fence > 0),
	owner TEXT NOT NULL)`); err != nil {
			return err
		}
		return s.checkSQLite(ctx)
	}
	// Two processes creating the table at once would collide in the
	// catalog; the advisory lock makes them take turns.
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, s.lockID("create table")); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+q+` (
	lease_key TEXT COLLATE "C" NOT NULL PRIMARY KEY,
	fence BIGINT NOT NULL CHECK (fence > 0),
	owner TEXT COLLATE "C" NOT NULL)`); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	return s.checkPostgres(ctx)
}

// checkSQLite verifies a table someone else may have made: lease_key is
// the whole primary key, fence has integer affinity (a TEXT fence would
// compare "10" < "9"), owner exists.
func (s *SQLStore) checkSQLite(ctx context.Context) error {
	schema, name := "main", s.table
	if i := strings.IndexByte(name, '.'); i >= 0 {
		schema, name = name[:i], name[i+1:]
	}
	rows, err := s.db.QueryContext(ctx, `SELECT name, type, pk FROM pragma_table_info(?, ?)`, name, schema)
	if err != nil {
		return err
	}
	defer rows.Close()
	types, pks := map[string]string{}, map[string]int{}
	for rows.Next() {
		var col, typ string
		var pk int
		if err := rows.Scan(&col, &typ, &pk); err != nil {
			return err
		}
		types[strings.ToLower(col)] = strings.ToUpper(typ)
		if pk > 0 {
			pks[strings.ToLower(col)] = pk
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	return checkStoreShape(types, len(pks) == 1 && pks["lease_key"] == 1, func(typ string) bool { return strings.Contains(typ, "INT") })
}

// checkPostgres verifies a table someone else may have made: fence is a
// bigint and lease_key alone is unique.
func (s *SQLStore) checkPostgres(ctx context.Context) error {
	rel := s.d.quote(s.table)
	rows, err := s.db.QueryContext(ctx, `SELECT a.attname, format_type(a.atttypid, a.atttypmod)
FROM pg_attribute a WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped`, rel)
	if err != nil {
		return err
	}
	defer rows.Close()
	types := map[string]string{}
	for rows.Next() {
		var col, typ string
		if err := rows.Scan(&col, &typ); err != nil {
			return err
		}
		types[col] = typ
	}
	if err := rows.Err(); err != nil {
		return err
	}
	var unique bool
	err = s.db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_index i
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
WHERE i.indrelid = to_regclass($1) AND i.indisunique AND i.indnkeyatts = 1 AND i.indpred IS NULL
 AND a.attname = 'lease_key')`, rel).Scan(&unique)
	if err != nil {
		return err
	}
	return checkStoreShape(types, unique, func(typ string) bool { return typ == "bigint" })
}

// checkStoreShape reports what is wrong with a store table whose column
// types are types, given whether lease_key alone is unique.
func checkStoreShape(types map[string]string, keyUnique bool, fenceTypeOK func(string) bool) error {
	for _, col := range []string{"lease_key", "fence", "owner"} {
		if _, ok := types[col]; !ok {
			return fmt.Errorf("%w: the table has no column %s (want lease_key, fence, owner)", ErrSchema, col)
		}
	}
	if !fenceTypeOK(types["fence"]) {
		return fmt.Errorf("%w: column fence is %s, want a 64-bit integer (fences would not compare as numbers)", ErrSchema, types["fence"])
	}
	if !keyUnique {
		return fmt.Errorf("%w: column lease_key is not the table's primary key (one row per lease key is what keeps fences ordered)",
			ErrSchema)
	}
	return nil
}

// lockID maps a lease key of this store's table to a PostgreSQL advisory
// lock id. Two keys sharing an id only wait for each other.
func (s *SQLStore) lockID(key string) int64 {
	sum := sha256.Sum256([]byte("fenced-http-store\n" + s.table + "\n" + key))
	return int64(binary.BigEndian.Uint64(sum[:8]))
}

// Admit implements Store. It waits for the key within this process. It
// raises the key's row to t in one committed statement, if the row admits t.
// Then, on PostgreSQL, it waits for the key across processes and confirms
// that no newer token was admitted meanwhile. Errors: ErrInvalidToken for a
// bad token, ctx's cause while waiting, and database errors. After those the
// handler must not run and the key is free (the row may have been raised, as
// a Claim would).
//
// On PostgreSQL each admitted request holds one connection of the store's
// pool until done is called. A handler that also needs a connection from the
// same pool can exhaust it. So give the store its own *sql.DB, or a pool
// larger than the requests you serve at once.
func (s *SQLStore) Admit(ctx context.Context, t Token) (Result, func(), error) {
	if err := t.Validate(); err != nil {
		return Result{}, nil, err
	}
	unlock, err := s.locks.lock(ctx, t.Key)
	if err != nil {
		return Result{}, nil, err
	}
	var fence int64
	var owner string
	err = s.db.QueryRowContext(ctx, s.upsert, t.Key, int64(t.Fence), t.Owner).Scan(&fence, &owner)
	if errors.Is(err, sql.ErrNoRows) {
		err = s.db.QueryRowContext(ctx, s.read, t.Key).Scan(&fence, &owner)
		unlock()
		if err != nil {
			return Result{}, nil, fmt.Errorf("fence: store %s: read %q: %w", s.table, t.Key, err)
		}
		return classify(t, uint64(fence), owner), nil, nil
	}
	if err != nil {
		unlock()
		return Result{}, nil, fmt.Errorf("fence: store %s: admit %s: %w", s.table, t, err)
	}
	release := unlock
	if s.d == Postgres {
		tx, r, err := s.lockAcrossProcesses(ctx, t)
		if err != nil || !r.Applied() {
			unlock()
			return r, nil, err
		}
		release = func() {
			tx.Rollback() // ends the lock; a broken connection ends its session, and the lock with it
			unlock()
		}
	}
	var once sync.Once
	return Result{Outcome: Applied, Current: t.Fence}, func() { once.Do(release) }, nil
}

// lockAcrossProcesses takes t.Key's advisory lock in a transaction that
// holds it until rolled back. Then it reads the key's row in that
// transaction. If another process admitted a newer token while this one
// waited, it returns that Stale result and no transaction. The row was
// raised before, in its own statement, so the two steps never need two
// connections at once.
func (s *SQLStore) lockAcrossProcesses(ctx context.Context, t Token) (*sql.Tx, Result, error) {
	// The transaction must outlive a cancelled request context
	// (database/sql rolls a transaction back when its context ends, which
	// would free the key while the handler still runs); the wait for the
	// lock still ends with ctx.
	tx, err := s.db.BeginTx(context.WithoutCancel(ctx), nil)
	if err != nil {
		return nil, Result{}, fmt.Errorf("fence: store %s: %w", s.table, err)
	}
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, s.lockID(t.Key)); err != nil {
		tx.Rollback()
		if ctx.Err() != nil {
			return nil, Result{}, context.Cause(ctx)
		}
		return nil, Result{}, fmt.Errorf("fence: store %s: lock %q: %w", s.table, t.Key, err)
	}
	var fence int64
	var owner string
	if err := tx.QueryRowContext(ctx, s.read, t.Key).Scan(&fence, &owner); err != nil {
		tx.Rollback()
		return nil, Result{}, fmt.Errorf("fence: store %s: read %q: %w", s.table, t.Key, err)
	}
	if !t.admits(uint64(fence), owner) {
		tx.Rollback()
		return nil, classify(t, uint64(fence), owner), nil
	}
	return tx, Result{Outcome: Applied, Current: t.Fence}, nil
}

// Current returns the newest fence and owner admitted for key (0 and "" if
// none). It does not wait for the key's write in progress, so a handler
// behind Middleware may call it for its own key.
func (s *SQLStore) Current(ctx context.Context, key string) (fence uint64, owner string, err error) {
	var f int64
	err = s.db.QueryRowContext(ctx, s.read, key).Scan(&f, &owner)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, "", nil
	}
	if err != nil {
		return 0, "", fmt.Errorf("fence: store %s: read %q: %w", s.table, key, err)
	}
	return uint64(f), owner, nil
}
