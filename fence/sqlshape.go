package fence

import (
	"context"
	"database/sql"
	"fmt"
	"github.com/fenced-dev/fenced/internal/core/limits"
	"strconv"
	"strings"
)

// column is what the catalog says about one of the guard's columns.
type column struct {
	present bool
	// typ is the declared type: SQLite's declared type, PostgreSQL's
	// format_type ("bigint", "character varying(64)"), MySQL's data_type.
	typ string
	// length is MySQL's character_maximum_length (0 when not a string).
	length int64
	// collation is MySQL's collation_name ("" for binary types).
	collation string
}

// tableShape is what the catalog says about the guarded table.
type tableShape struct {
	exists                      bool
	key, fence, owner, leaseKey column
	// keyUnique is whether a primary key or a unique index (not partial,
	// not deferrable) covers the key column alone.
	keyUnique bool
}

// splitName splits the table name into schema ("" if none) and name.
func (g *SQL) splitName() (schema, name string) {
	name = g.table.Name
	if i := strings.IndexByte(name, '.'); i >= 0 {
		return name[:i], name[i+1:]
	}
	return "", name
}

// shapeOf reads the table's shape from the catalog, with single-row
// queries only, so that it runs on any Conn (including a caller's
// transaction). Errors are the database's.
func (g *SQL) shapeOf(ctx context.Context, c Conn) (tableShape, error) {
	var sh tableShape
	schema, name := g.splitName()
	t := g.table
	var (
		n                            int64
		keyT, fenceT, ownerT, leaseT sql.NullString
		ownerLen, leaseLen           sql.NullInt64
		ownerColl, leaseColl         sql.NullString
		unique                       bool
		colsQuery, uniqueQuery       string
		colsArgs, uniqueArgs         []any
		dest                         = []any{&n, &keyT, &fenceT, &ownerT, &leaseT}
	)
	switch g.dialect {
	case SQLite:
		if schema == "" {
			schema = "main"
		}
		colsQuery = `SELECT COUNT(*),
 MAX(CASE WHEN name = ?3 COLLATE NOCASE THEN type END), MAX(CASE WHEN name = ?4 COLLATE NOCASE THEN type END),
 MAX(CASE WHEN name = ?5 COLLATE NOCASE THEN type END), MAX(CASE WHEN name = ?6 COLLATE NOCASE THEN type END)
FROM pragma_table_info(?1, ?2)`
		colsArgs = []any{name, schema, t.Key, t.FenceColumn, t.OwnerColumn, t.LeaseKeyColumn}
		// An INTEGER PRIMARY KEY aliases the rowid and has no index of its
		// own; every other unique key has one in pragma_index_list.
		uniqueQuery = `SELECT EXISTS (SELECT 1 FROM pragma_table_info(?1, ?2)
   WHERE pk = 1 AND name = ?3 COLLATE NOCASE AND upper(type) = 'INTEGER'
   AND (SELECT COUNT(*) FROM pragma_table_info(?1, ?2) WHERE pk > 0) = 1)
 OR EXISTS (SELECT 1 FROM pragma_index_list(?1, ?2) AS il WHERE il."unique" = 1 AND il.partial = 0
   AND (SELECT COUNT(*) FROM pragma_index_info(il.name, ?2)) = 1
   AND EXISTS (SELECT 1 FROM pragma_index_info(il.name, ?2) WHERE name = ?3 COLLATE NOCASE))`
		uniqueArgs = []any{name, schema, t.Key}
	case Postgres:
		colsQuery = `SELECT COUNT(*),
 MAX(CASE WHEN attname = $2 THEN format_type(atttypid, atttypmod) END),
 MAX(CASE WHEN attname = $3 THEN format_type(atttypid, atttypmod) END),
 MAX(CASE WHEN attname = $4 THEN format_type(atttypid, atttypmod) END),
 MAX(CASE WHEN attname = $5 THEN format_type(atttypid, atttypmod) END)
FROM pg_attribute WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped`
		colsArgs = []any{g.qTable, t.Key, t.FenceColumn, t.OwnerColumn, t.LeaseKeyColumn}
		uniqueQuery = `SELECT EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
 WHERE i.indrelid = to_regclass($1) AND i.indisunique AND i.indimmediate AND i.indpred IS NULL AND i.indnkeyatts = 1 AND a.attname = $2)`
		uniqueArgs = []any{g.qTable, t.Key}
	case MySQL:
		var s any
		if schema != "" {
			s = schema
		}
		colsQuery = `SELECT COUNT(*),
 MAX(CASE WHEN LOWER(column_name) = LOWER(?) THEN data_type END), MAX(CASE WHEN LOWER(column_name) = LOWER(?) THEN data_type END),
 MAX(CASE WHEN LOWER(column_name) = LOWER(?) THEN data_type END), MAX(CASE WHEN LOWER(column_name) = LOWER(?) THEN data_type END),
 MAX(CASE WHEN LOWER(column_name) = LOWER(?) THEN character_maximum_length END),
 MAX(CASE WHEN LOWER(column_name) = LOWER(?) THEN character_maximum_length END),
 MAX(CASE WHEN LOWER(column_name) = LOWER(?) THEN collation_name END), MAX(CASE WHEN LOWER(column_name) = LOWER(?) THEN collation_name END)
FROM information_schema.columns WHERE table_schema = COALESCE(?, DATABASE()) AND table_name = ?`
		colsArgs = []any{t.Key, t.FenceColumn, t.OwnerColumn, t.LeaseKeyColumn, t.OwnerColumn, t.LeaseKeyColumn, t.OwnerColumn,
			t.LeaseKeyColumn, s, name}
		dest = append(dest, &ownerLen, &leaseLen, &ownerColl, &leaseColl)
		uniqueQuery = `SELECT EXISTS (SELECT 1 FROM information_schema.statistics s
 WHERE s.table_schema = COALESCE(?, DATABASE()) AND s.table_name = ? AND s.non_unique = 0 AND LOWER(s.column_name) = LOWER(?)
   AND NOT EXISTS (SELECT 1 FROM information_schema.statistics s2
     WHERE s2.table_schema = s.table_schema AND s2.table_name = s.table_name AND s2.index_name = s.index_name AND s2.seq_in_index > 1))`
		uniqueArgs = []any{s, name, t.Key}
	}
	if err := c.QueryRow(ctx, colsQuery, colsArgs...).Scan(dest...); err != nil {
		return sh, fmt.Errorf("fence: read the columns of %s: %w", t.Name, err)
	}
	if n == 0 {
		return sh, nil
	}
	sh.exists = true
	col := func(typ sql.NullString, length sql.NullInt64, coll sql.NullString) column {
		return column{present: typ.Valid, typ: typ.String, length: length.Int64, collation: coll.String}
	}
	sh.key = col(keyT, sql.NullInt64{}, sql.NullString{})
	sh.fence = col(fenceT, sql.NullInt64{}, sql.NullString{})
	sh.owner = col(ownerT, ownerLen, ownerColl)
	sh.leaseKey = col(leaseT, leaseLen, leaseColl)
	if !sh.key.present {
		return sh, nil
	}
	if err := c.QueryRow(ctx, uniqueQuery, uniqueArgs...).Scan(&unique); err != nil {
		return sh, fmt.Errorf("fence: read the indexes of %s: %w", t.Name, err)
	}
	sh.keyUnique = unique
	return sh, nil
}

// sqliteAffinity returns the affinity SQLite gives a declared type
// (https://sqlite.org/datatype3.html, 3.1).
func sqliteAffinity(declared string) string {
	t := strings.ToUpper(declared)
	switch {
	case strings.Contains(t, "INT"):
		return "INTEGER"
	case strings.Contains(t, "CHAR"), strings.Contains(t, "CLOB"), strings.Contains(t, "TEXT"):
		return "TEXT"
	case t == "", strings.Contains(t, "BLOB"):
		return "BLOB"
	case strings.Contains(t, "REAL"), strings.Contains(t, "FLOA"), strings.Contains(t, "DOUB"):
		return "REAL"
	}
	return "NUMERIC"
}

// problems returns an error matching ErrSchema that lists everything wrong
// with sh, or nil.
func (g *SQL) problems(sh tableShape) error {
	t := g.table
	if !sh.exists {
		return fmt.Errorf("%w: table %s does not exist", ErrSchema, t.Name)
	}
	var missing []string
	for _, c := range []struct {
		name string
		col  column
	}{{t.Key, sh.key}, {t.FenceColumn, sh.fence}, {t.OwnerColumn, sh.owner}, {t.LeaseKeyColumn, sh.leaseKey}} {
		if !c.col.present {
			missing = append(missing, c.name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: table %s has no column %s (EnsureColumns adds the fence, owner and lease key columns)",
			ErrSchema, t.Name, strings.Join(missing, ", "))
	}
	var bad []string
	if !sh.keyUnique {
		bad = append(bad,
			fmt.Sprintf("key column %s is not unique: it needs a primary key or a unique index of its own (not partial, not deferrable), "+
				"or a guarded write could match and change several rows; for example CREATE UNIQUE INDEX ON %s (%s)", t.Key, t.Name, t.Key))
	}
	if msg := g.fenceTypeProblem(sh.fence); msg != "" {
		bad = append(bad, msg)
	}
	for _, c := range []struct {
		name string
		col  column
		need int
	}{{t.OwnerColumn, sh.owner, MaxOwnerLen}, {t.LeaseKeyColumn, sh.leaseKey, limits.MaxKeyLen}} {
		if msg := g.textTypeProblem(c.name, c.col, c.need); msg != "" {
			bad = append(bad, msg)
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("%w: table %s: %s", ErrSchema, t.Name, strings.Join(bad, "; "))
	}
	return nil
}

// fenceTypeProblem says what is wrong with the fence column's type, if
// anything: it must hold 64-bit integers and compare them as numbers.
func (g *SQL) fenceTypeProblem(c column) string {
	ok := false
	switch g.dialect {
	case SQLite:
		ok = sqliteAffinity(c.typ) == "INTEGER"
	case Postgres:
		ok = c.typ == "bigint"
	case MySQL:
		ok = strings.EqualFold(c.typ, "bigint")
	}
	if ok {
		return ""
	}
	return fmt.Sprintf("fence column %s has type %q; it must be a 64-bit integer (BIGINT; on SQLite a type containing INT): "+
		"another type compares or stores fences wrongly (as text 10 sorts before 2)", g.table.FenceColumn, c.typ)
}

// textTypeProblem says what is wrong with an identity column (owner or
// lease key) that must hold need bytes and compare them exactly.
func (g *SQL) textTypeProblem(name string, c column, need int) string {
	switch g.dialect {
	case SQLite:
		if sqliteAffinity(c.typ) != "TEXT" {
			return fmt.Sprintf("column %s has type %q; it must be TEXT", name, c.typ)
		}
	case Postgres:
		if c.typ == "text" || c.typ == "character varying" {
			return ""
		}
		if n, ok := strings.CutPrefix(c.typ, "character varying("); ok {
			if l, err := strconv.Atoi(strings.TrimSuffix(n, ")")); err == nil && l >= need {
				return ""
			}
			return fmt.Sprintf("column %s has type %s; it must hold %d characters (text)", name, c.typ, need)
		}
		return fmt.Sprintf("column %s has type %s; it must be text or varchar "+
			"(character pads and compares without trailing spaces, citext ignores case)", name, c.typ)
	case MySQL:
		fix := fmt.Sprintf("EnsureColumns converts it, or ALTER TABLE %s MODIFY %s", g.table.Name, g.mysqlTextDef(name, need))
		switch strings.ToLower(c.typ) {
		case "varchar", "varbinary", "text", "mediumtext", "longtext", "blob", "mediumblob", "longblob":
		default:
			return fmt.Sprintf("column %s has type %s; it must be VARCHAR or VARBINARY (%s)", name, c.typ, fix)
		}
		if c.length > 0 && c.length < int64(need) {
			return fmt.Sprintf("column %s holds %d characters; it must hold %d (%s)", name, c.length, need, fix)
		}
		if c.collation != "" && !strings.HasSuffix(strings.ToLower(c.collation), "_bin") {
			return fmt.Sprintf("column %s uses collation %s, which can take different strings for equal (case, accents, trailing spaces); "+
				"it needs a binary type or a _bin collation (%s)", name, c.collation, fix)
		}
	}
	return ""
}

// mysqlTextDef is the MySQL definition of an identity column holding need
// bytes of ASCII (owner) or UTF-8 (lease key), compared byte for byte.
func (g *SQL) mysqlTextDef(name string, need int) string {
	cs := "utf8mb4"
	if name == g.table.OwnerColumn {
		cs = "ascii"
	}
	return fmt.Sprintf("%s VARCHAR(%d) CHARACTER SET %s COLLATE %s_bin NOT NULL DEFAULT ''", g.dialect.quote(name), need, cs, cs)
}

// inspect reads the table's shape and returns what is wrong with it: an
// error matching ErrSchema, or a database error.
func (g *SQL) inspect(ctx context.Context, c Conn) (tableShape, error) {
	sh, err := g.shapeOf(ctx, c)
	if err != nil {
		return sh, err
	}
	return sh, g.problems(sh)
}

// ready returns nil once the table's shape is known to be right. The first
// time, it checks the shape on c, the connection (or transaction) the write
// is about to use. So it can neither wait on a pool the caller holds nor
// miss a table only that transaction sees. On SQLite with a deferred BEGIN,
// this read starts the transaction's snapshot just before the guard's
// update. If another connection commits in between, the update fails with
// SQLITE_BUSY, as in any read-then-write transaction, once per guard. Check
// or EnsureColumns at start-up avoids it.
func (g *SQL) ready(ctx context.Context, c Conn) error {
	if g.checked.Load() {
		return nil
	}
	if _, err := g.inspect(ctx, c); err != nil {
		return err
	}
	g.checked.Store(true)
	return nil
}

// Check verifies the table's shape, changing nothing. The table must exist.
// Its key column must exist and be unique: a primary key or a unique index
// on it alone, not partial, not deferrable. The fence column must be a
// 64-bit integer. The owner and lease key columns must be text that holds
// MaxOwnerLen and limits.MaxKeyLen bytes. On MySQL they must compare byte
// for byte (a binary type or a _bin collation). Errors match ErrSchema and
// name everything that is wrong. Writes check the shape themselves on first
// use. Calling Check (or EnsureColumns) at start-up reports a wrong table
// early.
func (g *SQL) Check(ctx context.Context) error {
	if _, err := g.inspect(ctx, sqlConn{g.db}); err != nil {
		return err
	}
	g.checked.Store(true)
	return nil
}

// EnsureColumns adds the guard's columns to the table if they are missing.
// The fence column is BIGINT NOT NULL DEFAULT 0, never negative. The owner
// and lease key columns are text NOT NULL DEFAULT ”, compared byte for byte:
// COLLATE "C" on PostgreSQL, CHARACTER SET ascii/utf8mb4 with a _bin
// collation on MySQL. On MySQL it also converts an owner or lease key column
// with another collation (as earlier versions created the owner column) to
// that definition, which rebuilds the table. Then it runs Check.
//
// It does not create the table and never changes the key or fence column. A
// missing table or key column, a key that is not unique, or a fence column
// of the wrong type is an error matching ErrSchema; nothing is changed then.
// Running it concurrently from several processes is safe.
func (g *SQL) EnsureColumns(ctx context.Context) error {
	c := sqlConn{g.db}
	sh, err := g.shapeOf(ctx, c)
	if err != nil {
		return err
	}
	if !sh.exists {
		return fmt.Errorf("fence: ensure columns: %w: table %s does not exist", ErrSchema, g.table.Name)
	}
	if !sh.key.present {
		return fmt.Errorf("fence: ensure columns: %w: table %s has no key column %s", ErrSchema, g.table.Name, g.table.Key)
	}
	if !sh.keyUnique || (sh.fence.present && g.fenceTypeProblem(sh.fence) != "") {
		// Refuse before changing anything.
		return fmt.Errorf("fence: ensure columns: %w", g.problems(sh))
	}
	var fenceType, ownerType, keyType string
	switch g.dialect {
	case SQLite:
		fenceType, ownerType, keyType = "INTEGER", "TEXT NOT NULL DEFAULT ''", "TEXT NOT NULL DEFAULT ''"
	case Postgres:
		fenceType, ownerType, keyType = "bigint", `text COLLATE "C" NOT NULL DEFAULT ''`, `text COLLATE "C" NOT NULL DEFAULT ''`
	case MySQL:
		fenceType = "BIGINT"
		ownerType = strings.TrimPrefix(g.mysqlTextDef(g.table.OwnerColumn, MaxOwnerLen), g.dialect.quote(g.table.OwnerColumn)+" ")
		keyType = strings.TrimPrefix(g.mysqlTextDef(g.table.LeaseKeyColumn, limits.MaxKeyLen), g.dialect.quote(g.table.LeaseKeyColumn)+" ")
	}
	alter := func(col, change, ddl string, done func(tableShape) bool) error {
		if _, err := g.db.ExecContext(ctx, ddl); err != nil {
			// Another process may have done it meanwhile.
			if again, cerr := g.shapeOf(ctx, c); cerr == nil && done(again) {
				return nil
			}
			return fmt.Errorf("fence: ensure columns: %s %s of %s: %w", change, col, g.table.Name, err)
		}
		return nil
	}
	add := func(col, def string, present func(tableShape) bool) error {
		if present(sh) {
			return nil
		}
		return alter(col, "add", fmt.Sprintf("ALTER TABLE %s ADD COLUMN %s %s", g.qTable, g.dialect.quote(col), def), present)
	}
	if err := add(g.table.FenceColumn, fmt.Sprintf("%s NOT NULL DEFAULT 0 CHECK (%s >= 0)",
		fenceType, g.qFence), func(s tableShape) bool { return s.fence.present }); err != nil {
		return err
	}
	if err := add(g.table.OwnerColumn, ownerType, func(s tableShape) bool { return s.owner.present }); err != nil {
		return err
	}
	if err := add(g.table.LeaseKeyColumn, keyType, func(s tableShape) bool { return s.leaseKey.present }); err != nil {
		return err
	}
	if g.dialect == MySQL {
		for _, ic := range []struct {
			name string
			need int
			col  func(tableShape) column
		}{
			{g.table.OwnerColumn, MaxOwnerLen, func(s tableShape) column { return s.owner }},
			{g.table.LeaseKeyColumn, limits.MaxKeyLen, func(s tableShape) column { return s.leaseKey }},
		} {
			if !ic.col(sh).present || g.textTypeProblem(ic.name, ic.col(sh), ic.need) == "" {
				continue
			}
			fixed := func(s tableShape) bool { return g.textTypeProblem(ic.name, ic.col(s), ic.need) == "" }
			// Keep NULLs a column created by hand may hold: the guard reads
			// NULL as ''.
			def := strings.TrimSuffix(g.mysqlTextDef(ic.name, ic.need), " NOT NULL DEFAULT ''") + " DEFAULT ''"
			if err := alter(ic.name, "convert", fmt.Sprintf("ALTER TABLE %s MODIFY %s", g.qTable, def), fixed); err != nil {
				return err
			}
		}
	}
	if err := g.Check(ctx); err != nil {
		return fmt.Errorf("fence: ensure columns: %w", err)
	}
	return nil
}
