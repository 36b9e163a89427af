// Package sqlident validates SQL identifiers (table and column names) that
// come from URLs or options, so they are never spliced into SQL unchecked.
package sqlident

import (
	"fmt"
	"regexp"
	"strings"
)

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// Check returns an error naming what (for example "table") unless name is a
// plain identifier. That is a letter or underscore followed by at most 62
// letters, digits or underscores. Such names need no quoting in any SQL
// dialect fenced supports, and cannot carry SQL.
func Check(what, name string) error {
	if !identRE.MatchString(name) {
		return fmt.Errorf("%s name %q is not a plain SQL identifier (letters, digits and _, starting with a letter or _, "+
			"at most 63 characters)", what, name)
	}
	return nil
}

// QuoteANSI quotes name as a standard SQL identifier, in double quotes
// (PostgreSQL, SQLite, and MySQL in ANSI_QUOTES mode), doubling any double
// quote in it. Quoted names are matched with their exact spelling.
func QuoteANSI(name string) string {
	return `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
}

// QuoteMySQL quotes name as a MySQL/MariaDB identifier, in backticks,
// doubling any backtick in it.
func QuoteMySQL(name string) string {
	return "`" + strings.ReplaceAll(name, "`", "``") + "`"
}
