package fencedmysql_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/fencedmysql"
)

// TestTableNames opens stores through the URL opener with table names the
// SQL backends' rule allows (a lower-case plain identifier of at most 48
// bytes), which must be created and used, and with names it refuses,
// which must be refused before connecting, naming the name.
func TestTableNames(t *testing.T) {
	ctx := context.Background()
	for _, name := range []string{"leases_v2", "_t", "t1", strings.Repeat("n", 48)} {
		d, err := fencedmysql.Open(ctx, my.URL("table="+name))
		if err != nil {
			t.Errorf("table %q: %v, want it accepted", name, err)
			continue
		}
		if _, err := d.TryAcquire(ctx, "names:k", "owner-0123456789abcdef", 10*time.Second); err != nil {
			t.Errorf("table %q: TryAcquire: %v", name, err)
		}
		d.Close()
	}
	for _, name := range []string{"fenced-leases", "Leases", "1abc", "a b", "a;drop", "é", strings.Repeat("n", 49), "a.b", ""} {
		_, err := fencedmysql.Open(ctx, "mysql://127.0.0.1:1/db?table="+url.QueryEscape(name))
		if !errors.Is(err, driver.ErrInvalidURL) || !strings.Contains(err.Error(), "table") {
			t.Errorf("table %q: %v, want ErrInvalidURL naming the table", name, err)
		}
	}
}
