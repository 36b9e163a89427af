package fencedsqlite_test

import (
	"net/url"
	"path/filepath"
	"testing"

	"github.com/fenced-dev/fenced/internal/testkit/opentest"
)

// TestTableNames opens stores with the table names the SQL backends' rule
// allows, which must be created and used. Names it refuses must be
// refused before the file is opened, naming the table.
func TestTableNames(t *testing.T) {
	file := filepath.Join(t.TempDir(), "names.db")
	u := func(name string) string { return "sqlite://" + file + "?table=" + url.QueryEscape(name) }
	opentest.SQLTables(u, u).Check(t)
}
