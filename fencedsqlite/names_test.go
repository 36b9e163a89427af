package fencedsqlite_test

import (
	"context"
	"errors"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
)

// TestTableNames opens stores through the URL opener with table names the
// SQL backends' rule allows (a lower-case plain identifier of at most 48
// bytes), which must be created and used, and with names it refuses,
// which must be refused before the file is opened, naming the name.
func TestTableNames(t *testing.T) {
	ctx := context.Background()
	file := filepath.Join(t.TempDir(), "names.db")
	for _, name := range []string{"leases_v2", "_t", "t1", strings.Repeat("n", 48)} {
		c, err := fenced.Open(ctx, "sqlite://"+file+"?table="+name, nil)
		if err != nil {
			t.Errorf("table %q: %v, want it accepted", name, err)
			continue
		}
		if _, err := c.TryAcquire(ctx, "names:k", &fenced.LeaseOptions{TTL: 10 * time.Second}); err != nil {
			t.Errorf("table %q: TryAcquire: %v", name, err)
		}
		c.Close()
	}
	for _, name := range []string{"fenced-leases", "Leases", "1abc", "a b", "a;drop", "é", strings.Repeat("n", 49), "a.b", ""} {
		_, err := fenced.Open(ctx, "sqlite://"+file+"?table="+url.QueryEscape(name), nil)
		if !errors.Is(err, driver.ErrInvalidURL) || !strings.Contains(err.Error(), "table") {
			t.Errorf("table %q: %v, want ErrInvalidURL naming the table", name, err)
		}
	}
}
