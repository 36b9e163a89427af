package intent

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"

	"github.com/fenced-dev/fenced/fence"
)

// The intent table's columns; identity columns decide which intent a
// statement reaches and must compare byte for byte.
var (
	requiredColumns = []string{"namespace", "id", "idempotency_key", "create_token", "state", "payload", "ref",
		"reason", "attempts", "created_ms", "updated_ms", "checked_ms", "fence", "fence_owner"}
	identityColumns = []string{"namespace", "id", "idempotency_key"}
)

// tableColumn is a column as the database's catalog describes it.
type tableColumn struct {
	typ       string // catalog type, lower case
	collation string // MySQL: collation name, "" for binary types
	// folds is set when the column's collation may call different strings
	// equal (PostgreSQL's nondeterministic collations).
	folds bool
}

// tableIndex is a unique index or the primary key.
type tableIndex struct {
	name    string
	primary bool
	cols    []string // key columns in order, lower case
	// partial is set for an index that does not cover whole column values
	// of every row: a WHERE clause, an expression or a prefix.
	partial bool
	// collations lists non-binary collations of its columns (SQLite), or
	// is "nondeterministic" (PostgreSQL).
	folding string
}

func (s *Store) tableExists(ctx context.Context) (bool, error) {
	cols, err := s.readColumns(ctx)
	return len(cols) > 0, err
}

// readColumns returns the table's columns by lower-case name; none when the
// table does not exist.
func (s *Store) readColumns(ctx context.Context) (map[string]tableColumn, error) {
	var (
		rows *sql.Rows
		err  error
	)
	switch s.d {
	case fence.SQLite:
		rows, err = s.db.QueryContext(ctx, `SELECT name, type, '', 0 FROM pragma_table_info(?)`, s.table)
	case fence.Postgres:
		rows, err = s.db.QueryContext(ctx, `SELECT a.attname, format_type(a.atttypid, a.atttypmod), COALESCE(c.collname, ''),
  CASE WHEN COALESCE((to_jsonb(c) ->> 'collisdeterministic')::boolean, true) THEN 0 ELSE 1 END
FROM pg_attribute a LEFT JOIN pg_collation c ON c.oid = a.attcollation
WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped`, s.table)
	case fence.MySQL:
		rows, err = s.db.QueryContext(ctx, `SELECT column_name, data_type, COALESCE(collation_name, ''), 0
FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = ?`, s.table)
	}
	if err != nil {
		return nil, fmt.Errorf("intent: read columns of %s: %w", s.table, err)
	}
	defer rows.Close()
	out := map[string]tableColumn{}
	for rows.Next() {
		var name, typ, coll string
		var folds int
		if err := rows.Scan(&name, &typ, &coll, &folds); err != nil {
			return nil, fmt.Errorf("intent: read columns of %s: %w", s.table, err)
		}
		out[strings.ToLower(name)] = tableColumn{typ: strings.ToLower(typ), collation: strings.ToLower(coll), folds: folds != 0}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("intent: read columns of %s: %w", s.table, err)
	}
	return out, nil
}

// readIndexes returns the table's primary key and unique indexes.
func (s *Store) readIndexes(ctx context.Context) ([]tableIndex, error) {
	var (
		rows *sql.Rows
		err  error
	)
	switch s.d {
	case fence.SQLite:
		return s.readSQLiteIndexes(ctx)
	case fence.Postgres:
		rows, err = s.db.QueryContext(ctx, `SELECT i.indexrelid::regclass::text, i.indisprimary,
  bool_or(i.indpred IS NOT NULL OR i.indexprs IS NOT NULL OR a.attname IS NULL),
  string_agg(COALESCE(a.attname, '?'), ',' ORDER BY k.n),
  CASE WHEN bool_and(COALESCE((to_jsonb(c) ->> 'collisdeterministic')::boolean, true)) THEN '' ELSE 'nondeterministic' END
FROM pg_index i
CROSS JOIN LATERAL unnest(i.indkey::int2[], i.indcollation::oid[]) WITH ORDINALITY AS k(attnum, coll, n)
LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
LEFT JOIN pg_collation c ON c.oid = k.coll
WHERE i.indrelid = to_regclass($1) AND i.indisunique AND k.n <= i.indnkeyatts
GROUP BY i.indexrelid, i.indisprimary`, s.table)
	case fence.MySQL:
		rows, err = s.db.QueryContext(ctx, `SELECT index_name, index_name = 'PRIMARY',
  MAX(sub_part IS NOT NULL OR column_name IS NULL),
  GROUP_CONCAT(COALESCE(column_name, '?') ORDER BY seq_in_index SEPARATOR ','), ''
FROM information_schema.statistics
WHERE table_schema = DATABASE() AND table_name = ? AND non_unique = 0
GROUP BY index_name`, s.table)
	}
	if err != nil {
		return nil, fmt.Errorf("intent: read indexes of %s: %w", s.table, err)
	}
	defer rows.Close()
	var out []tableIndex
	for rows.Next() {
		var ix tableIndex
		var cols string
		if err := rows.Scan(&ix.name, &ix.primary, &ix.partial, &cols, &ix.folding); err != nil {
			return nil, fmt.Errorf("intent: read indexes of %s: %w", s.table, err)
		}
		ix.cols = strings.Split(strings.ToLower(cols), ",")
		out = append(out, ix)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("intent: read indexes of %s: %w", s.table, err)
	}
	return out, nil
}

func (s *Store) readSQLiteIndexes(ctx context.Context) ([]tableIndex, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT name, origin = 'pk', partial FROM pragma_index_list(?) WHERE "unique"`, s.table)
	if err != nil {
		return nil, fmt.Errorf("intent: read indexes of %s: %w", s.table, err)
	}
	var out []tableIndex
	for rows.Next() {
		var ix tableIndex
		if err := rows.Scan(&ix.name, &ix.primary, &ix.partial); err != nil {
			rows.Close()
			return nil, fmt.Errorf("intent: read indexes of %s: %w", s.table, err)
		}
		out = append(out, ix)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("intent: read indexes of %s: %w", s.table, err)
	}
	for i := range out {
		ix := &out[i]
		cols, err := s.db.QueryContext(ctx, `SELECT name, coll FROM pragma_index_xinfo(?) WHERE key ORDER BY seqno`, ix.name)
		if err != nil {
			return nil, fmt.Errorf("intent: read index %s: %w", ix.name, err)
		}
		var folding []string
		for cols.Next() {
			var name sql.NullString
			var coll string
			if err := cols.Scan(&name, &coll); err != nil {
				cols.Close()
				return nil, fmt.Errorf("intent: read index %s: %w", ix.name, err)
			}
			if !name.Valid {
				ix.partial = true // an expression
				name.String = "?"
			}
			ix.cols = append(ix.cols, strings.ToLower(name.String))
			if !strings.EqualFold(coll, "BINARY") {
				folding = append(folding, name.String+" COLLATE "+coll)
			}
		}
		cols.Close()
		if err := cols.Err(); err != nil {
			return nil, fmt.Errorf("intent: read index %s: %w", ix.name, err)
		}
		ix.folding = strings.Join(folding, ", ")
	}
	return out, nil
}

// checkShape verifies that the table keeps intents apart: every column,
// primary key (namespace, id), a unique idempotency_key, and identity
// columns compared byte for byte. Errors match ErrSchema and list every
// difference.
func (s *Store) checkShape(ctx context.Context) error {
	cols, err := s.readColumns(ctx)
	if err != nil {
		return err
	}
	if len(cols) == 0 {
		return fmt.Errorf("intent: %w: table %s does not exist", ErrSchema, s.table)
	}
	indexes, err := s.readIndexes(ctx)
	if err != nil {
		return err
	}
	var problems []string
	var missing []string
	for _, c := range requiredColumns {
		if _, ok := cols[c]; !ok {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		problems = append(problems, "missing column "+strings.Join(missing, ", "))
	}
	for _, c := range identityColumns {
		if col, ok := cols[c]; ok {
			if p := s.identityProblem(c, col); p != "" {
				problems = append(problems, p)
			}
		}
	}
	if col, ok := cols["fence_owner"]; ok && s.d == fence.MySQL && col.typ != "varbinary" && !strings.HasSuffix(col.collation, "_bin") {
		problems = append(problems,
			fmt.Sprintf("column fence_owner is %s with collation %s, which folds case (want VARBINARY or a _bin collation)",
				col.typ, col.collation))
	}
	var primary, keyIndex *tableIndex
	for i := range indexes {
		ix := &indexes[i]
		switch {
		case ix.primary:
			primary = ix
		case slices.Equal(ix.cols, []string{"idempotency_key"}):
			if keyIndex == nil || keyIndex.partial || keyIndex.folding != "" {
				keyIndex = ix
			}
		case !slices.ContainsFunc(ix.cols, func(c string) bool { return c != "namespace" && c != "id" }):
			problems = append(problems, fmt.Sprintf("unique index %s on (%s) keeps namespaces from sharing ids",
				ix.name, strings.Join(ix.cols, ", ")))
		}
	}
	switch {
	case primary == nil:
		problems = append(problems, "no primary key, want (namespace, id)")
	case !slices.Equal(slices.Sorted(slices.Values(primary.cols)), []string{"id", "namespace"}):
		problems = append(problems, fmt.Sprintf("primary key is (%s), want (namespace, id)", strings.Join(primary.cols, ", ")))
	default:
		problems = append(problems, indexProblems(primary)...)
	}
	if keyIndex == nil {
		problems = append(problems, "idempotency_key has no unique index")
	} else {
		problems = append(problems, indexProblems(keyIndex)...)
	}
	if len(problems) == 0 {
		return nil
	}
	msg := fmt.Sprintf("table %s cannot keep intents apart: %s", s.table, strings.Join(problems, "; "))
	if _, hasNS := cols["namespace"]; !hasNS && primary != nil && slices.Equal(primary.cols, []string{"id"}) {
		msg += ". It is an intent table from before namespaces were part of the key: " +
			"migrate it as the package documentation says under \"Upgrading a table from before namespaces\""
	}
	return fmt.Errorf("intent: %w: %s", ErrSchema, msg)
}

func indexProblems(ix *tableIndex) []string {
	var out []string
	if ix.partial {
		out = append(out, fmt.Sprintf("index %s covers only part of (%s) (a prefix, an expression or a WHERE clause)",
			ix.name, strings.Join(ix.cols, ", ")))
	}
	if ix.folding != "" {
		out = append(out, fmt.Sprintf("index %s compares with a folding collation (%s)", ix.name, ix.folding))
	}
	return out
}

// identityProblem describes why column c would let different ids match,
// or returns "".
func (s *Store) identityProblem(c string, col tableColumn) string {
	switch s.d {
	case fence.MySQL:
		// VARBINARY compares bytes without padding. A VARCHAR is acceptable
		// only with a binary NO PAD collation: _ci folds case, and every
		// PAD SPACE collation (utf8mb4_bin too) ignores trailing spaces.
		if col.typ == "varbinary" || (col.typ == "varchar" && (strings.HasSuffix(col.collation, "_nopad_bin") ||
			col.collation == "utf8mb4_0900_bin")) {
			return ""
		}
		what := col.typ
		if col.collation != "" {
			what += " with collation " + col.collation
		}
		return fmt.Sprintf("column %s is %s, which can match different ids (case or trailing spaces); want VARBINARY", c, what)
	case fence.Postgres:
		if strings.HasPrefix(col.typ, "character(") || col.typ == "character" {
			return fmt.Sprintf("column %s is %s, which pads with spaces; want text", c, col.typ)
		}
		if col.folds {
			return fmt.Sprintf("column %s has the nondeterministic collation %s, which can match different ids; want a deterministic one",
				c, col.collation)
		}
	}
	// SQLite: a column's collation shows in the indexes over it.
	return ""
}
