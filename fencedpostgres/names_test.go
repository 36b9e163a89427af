package fencedpostgres_test

import (
	"net/url"
	"testing"

	"github.com/fenced-dev/fenced/internal/testkit/opentest"
)

// TestTableNames opens stores with the table names the SQL backends' rule
// allows, which must be created and used. Names it refuses must be
// refused before connecting, naming the table.
func TestTableNames(t *testing.T) {
	opentest.SQLTables(
		func(name string) string { return pg.URL("table=" + name) },
		func(name string) string { return "postgres://127.0.0.1:1/db?table=" + url.QueryEscape(name) },
	).Check(t)
}
