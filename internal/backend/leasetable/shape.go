package leasetable

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// Column is one column of a table's expected shape.
type Column struct {
	Name string
	// Type is the type as the backend reports it from the database's
	// catalog, lower case (for example "text", "bigint", "datetime(6)").
	Type string
	// Identity marks a column whose value names something (a key, an
	// owner): two values may compare equal only when they are equal byte
	// for byte, so a case-insensitive or space-padding collation is
	// refused.
	Identity bool
	// MinBytes, when positive, is how many bytes the column must hold, for
	// databases whose string columns have a declared maximum length and
	// may truncate longer values.
	MinBytes int64
}

// Shape is what a backend needs of one of its tables.
type Shape struct {
	Columns []Column
	// Key, when set, is the column that identifies a row. The backend's
	// upsert finds a key's row through a unique index, so the table must
	// have a primary key or unique index on exactly this column (whole
	// values, no predicate, an exact collation), and no other unique
	// index, which could make the grants of two different keys collide.
	Key string
	// AutoIncrement lists the columns the database may number by itself
	// (an audit table's id). Any other AUTO_INCREMENT column is refused:
	// MySQL reports its value through LAST_INSERT_ID, which is how the
	// grant returns the fence.
	AutoIncrement []string
}

// Existing is what a backend read from the database's catalog about a
// table that exists.
type Existing struct {
	// Columns maps lower-case column names to what the catalog says.
	Columns map[string]ExistingColumn
	// Unique lists the primary key, unique indexes and unique or
	// exclusion constraints.
	Unique []UniqueIndex
	// Problems are differences the backend found itself (a view instead
	// of a table, a storage engine without transactions), reported with
	// the others.
	Problems []string
}

// ExistingColumn is one column as the catalog describes it.
type ExistingColumn struct {
	// Type is the catalog type, lower case, in the form Column.Type uses.
	Type string
	// Inexact, when set, says why two different values of the column can
	// compare equal, for example "collation latin1_swedish_ci compares
	// case-insensitively".
	Inexact string
	// MaxBytes is the longest value the column holds, in bytes; zero when
	// unbounded or not a string column.
	MaxBytes int64
	// AutoIncrement is set for a MySQL AUTO_INCREMENT column.
	AutoIncrement bool
}

// UniqueIndex is one unique index or constraint of an existing table.
type UniqueIndex struct {
	Name string
	// Columns are the index's key columns in order; "" stands for an
	// expression.
	Columns []string
	// Defect, when set, says why the index does not decide uniqueness on
	// whole values of its columns, for example "covers only the first 10
	// bytes" or "has a WHERE clause".
	Defect string
}

// Check compares an existing table with the shape a backend needs and
// describes every difference in one error matching ErrSchema; nil when
// the table fits. Extra columns are allowed (unless AUTO_INCREMENT, see
// Shape.AutoIncrement); missing, retyped, inexact or too short ones never
// are.
func Check(table string, want Shape, got Existing) error {
	problems := slices.Clone(got.Problems)
	for _, c := range want.Columns {
		gc, ok := got.Columns[c.Name]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("missing column %s %s", c.Name, c.Type))
		case !strings.EqualFold(gc.Type, c.Type) && gc.Inexact != "":
			problems = append(problems, fmt.Sprintf("column %s is %s with %s, want %s", c.Name, gc.Type, gc.Inexact, c.Type))
		case !strings.EqualFold(gc.Type, c.Type):
			problems = append(problems, fmt.Sprintf("column %s is %s, want %s", c.Name, gc.Type, c.Type))
		case c.Identity && gc.Inexact != "":
			problems = append(problems,
				fmt.Sprintf("column %s: %s, so different %ss could be taken for the same", c.Name, gc.Inexact, c.Name))
		case c.MinBytes > 0 && gc.MaxBytes > 0 && gc.MaxBytes < c.MinBytes:
			problems = append(problems, fmt.Sprintf("column %s holds at most %d bytes, want %d", c.Name, gc.MaxBytes, c.MinBytes))
		}
	}
	var names []string
	for name := range got.Columns {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if got.Columns[name].AutoIncrement && !slices.Contains(want.AutoIncrement, name) {
			problems = append(problems,
				fmt.Sprintf("column %s is AUTO_INCREMENT (its value would replace the fence that the grant returns through LAST_INSERT_ID)",
					name))
		}
	}
	if want.Key != "" {
		problems = append(problems, checkKey(want.Key, got.Unique)...)
	}
	if len(problems) == 0 {
		return nil
	}
	var shape []string
	for _, c := range want.Columns {
		d := c.Name + " " + c.Type
		if c.Name == want.Key {
			d += " PRIMARY KEY"
		}
		shape = append(shape, d)
	}
	return fmt.Errorf("%w: table %q exists but %s; fenced needs (%s): migrate it, or choose another table with ?%s=",
		ErrSchema, table, strings.Join(problems, "; "), strings.Join(shape, ", "), TableParam)
}

// checkKey describes what is wrong with a table's unique indexes, given
// that key must be its only unique column.
func checkKey(key string, unique []UniqueIndex) []string {
	var problems []string
	usable := false
	for _, ix := range unique {
		cols := make([]string, len(ix.Columns))
		for i, c := range ix.Columns {
			cols[i] = c
			if c == "" {
				cols[i] = "an expression"
			}
		}
		on := fmt.Sprintf("unique index %s on (%s)", ix.Name, strings.Join(cols, ", "))
		switch {
		case !slices.Equal(ix.Columns, []string{key}):
			problems = append(problems, on+" could make the grants of two different keys collide; only "+key+" may be unique")
		case ix.Defect != "":
			problems = append(problems, on+" "+ix.Defect)
		default:
			usable = true
		}
	}
	if !usable {
		problems = append(problems,
			"no primary key or unique index on "+key+" alone (the upsert needs one to find a key's row; without it a second row, "+
				"and a second owner, can be inserted)")
	}
	return problems
}
