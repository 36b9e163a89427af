// Package leasetable holds the table-level pieces the SQL lease-table
// backends (PostgreSQL, MySQL/MariaDB, SQLite) share: validation of the
// table name taken from a store URL, the table shapes (ColumnTypes) and
// the check that an existing table has the shape the backend needs, the
// scanning of break audit rows, the prune loop, and the small conversions
// and errors every one of them needs. The lease operations themselves run
// in the engine, internal/backend/sqllease, over each backend's dialect.
package leasetable

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/backend/sqlident"
	"github.com/fenced-dev/fenced/internal/backend/urlquery"
	"github.com/fenced-dev/fenced/internal/core/token"
)

// DefaultTable is the lease table's name when the URL names none. The
// break audit table is the lease table's name plus BreaksSuffix, and the
// table that holds its fence floor the name plus FloorSuffix.
const (
	DefaultTable = "fenced_leases"
	BreaksSuffix = "_breaks"
	FloorSuffix  = "_floor"
	// TableParam is the URL query parameter that names the lease table.
	TableParam = "table"
)

// MaxTableLen bounds table names so that every name derived from them
// (audit table, notification channel, index) fits PostgreSQL's and MySQL's
// 63- and 64-byte identifier limits.
const MaxTableLen = 48

var lowerRE = regexp.MustCompile(`^[a-z0-9_]*$`)

// ErrSchema means the lease table (or its audit or floor table) exists with
// a shape other than the one the backend needs. It may be a table from an
// older version of fenced or another tool. Nothing is changed in that case.
var ErrSchema = errors.New("lease table has an unexpected shape")

// ValidateTable checks a lease table name. Every SQL backend uses the same
// rule, so one table= parameter works everywhere. The name must be a plain
// SQL identifier (sqlident.Check) of at most MaxTableLen bytes, in lower
// case. PostgreSQL folds unquoted names to lower case, and MySQL's table
// names follow the file system's case rules. Names are still quoted in SQL.
// Errors match fenced.ErrInvalidURL, since the name comes from the store
// URL.
func ValidateTable(name string) error {
	if err := sqlident.Check("table", name); err != nil {
		return fmt.Errorf("%w: %v", fenced.ErrInvalidURL, err)
	}
	switch {
	case len(name) > MaxTableLen:
		return fmt.Errorf("%w: table name %q is longer than %d bytes", fenced.ErrInvalidURL, name, MaxTableLen)
	case !lowerRE.MatchString(name):
		return fmt.Errorf("%w: table name %q must be lower case", fenced.ErrInvalidURL, name)
	}
	return nil
}

// TableOrDefault returns name validated with ValidateTable, or
// DefaultTable when name is "" (an option left at its zero value).
func TableOrDefault(name string) (string, error) {
	if name == "" {
		return DefaultTable, nil
	}
	return name, ValidateTable(name)
}

// TakeTable takes the validated table name given by the URL query
// parameter TableParam from p; DefaultTable when absent. Errors match
// fenced.ErrInvalidURL.
func TakeTable(p urlquery.Params) (string, error) {
	name, ok, err := p.Take(TableParam)
	switch {
	case err != nil:
		return "", err
	case !ok:
		return DefaultTable, nil
	}
	if err := ValidateTable(name); err != nil {
		return "", err
	}
	return name, nil
}

// Scanner is implemented by *sql.Rows, *sql.Row, pgx.Rows and pgx.Row.
type Scanner interface {
	Scan(dest ...any) error
}

// BreakColumns lists, in order, the columns ScanBreak expects; backends
// select them from their audit table in this order.
const BreakColumns = "broken_at, lease_key, fence, owner, reason, broken_by"

// ScanBreak scans one audit row selected as BreakColumns. The time column
// may come as a time.Time or as an integer count of microseconds since the
// Unix epoch in UTC. A backend selects the integer when its driver cannot
// be trusted to parse dates, as with a caller's MySQL pool.
func ScanBreak(s Scanner) (driver.BreakRecord, error) {
	var r driver.BreakRecord
	var at any
	var fence int64
	if err := s.Scan(&at, &r.Key, &fence, &r.Owner, &r.Reason, &r.By); err != nil {
		return r, err
	}
	switch v := at.(type) {
	case time.Time:
		r.Time = v
	case int64:
		r.Time = time.UnixMicro(v).UTC()
	default:
		return r, fmt.Errorf("audit row of %q: broken_at scanned as %T, want a time or microseconds", r.Key, at)
	}
	r.Fence = uint64(fence)
	return r, nil
}

// Rows is the part of *sql.Rows and pgx.Rows that ScanBreaks reads.
type Rows interface {
	Scanner
	Next() bool
	Err() error
}

// ScanBreaks reads every audit row of rows with ScanBreak. The caller
// closes rows.
func ScanBreaks(rows Rows) ([]driver.BreakRecord, error) {
	var out []driver.BreakRecord
	for rows.Next() {
		r, err := ScanBreak(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// NotHeld is the refusal of a renew or release of g.
func NotHeld(g driver.Grant) error {
	return fmt.Errorf("%s fence %d: %w", g.Key, g.Fence, fenced.ErrNotHeld)
}

// CheckOwner rejects an empty owner token, which the lease tables use to
// mark a free key and which therefore can never prove ownership.
func CheckOwner(owner string) error {
	if owner == "" {
		return errors.New("empty owner token")
	}
	return nil
}

// Held is the refusal of an acquire of key that has remaining left.
func Held(key string, remaining time.Duration) error {
	if remaining < 0 {
		remaining = 0
	}
	return &fenced.HeldError{Remaining: remaining}
}

// Info builds the LeaseInfo of a row: owner ("" when free), fence and the
// time left by the database's clock (not positive when expired).
func Info(key, owner string, fence int64, remaining time.Duration) driver.LeaseInfo {
	info := driver.LeaseInfo{Key: key, Fence: uint64(fence)}
	if owner != "" && remaining > 0 {
		info.Held = true
		token.Set(&info, owner)
		info.Remaining = remaining
	}
	return info
}

// Scrub removes password from a driver's error message, however the
// driver quoted it, so connection errors can be shown without the secret.
func Scrub(msg, password string) string {
	if password == "" {
		return msg
	}
	return strings.ReplaceAll(msg, password, "xxxxx")
}
