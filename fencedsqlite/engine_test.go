package fencedsqlite_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedsqlite"
)

// A TTL is never shortened: SQLite counts milliseconds, and a TTL that is
// not a whole number of them is rounded up (it used to be truncated, so
// 1.5ms became 1ms and 999µs a grant that had expired when granted).
func TestTTLRoundedUpToMilliseconds(t *testing.T) {
	ctx := context.Background()
	d, err := fencedsqlite.OpenFile(ctx, filepath.Join(t.TempDir(), "l.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for _, c := range []struct {
		ttl  time.Duration
		want int64
	}{{999 * time.Microsecond, 1}, {1500 * time.Microsecond, 2}, {time.Second, 1000}} {
		key := "ttl-" + c.ttl.String()
		if _, err := d.TryAcquire(ctx, key, "owner-1", c.ttl); err != nil {
			t.Fatal(err)
		}
		var ms int64
		// granted_ms and expires_ms are set from one reading of the clock.
		if err := d.DB().QueryRowContext(ctx, `SELECT expires_ms - granted_ms FROM `+fencedsqlite.DefaultTable+` WHERE key = ?`, key).Scan(&ms); err != nil {
			t.Fatal(err)
		}
		if ms != c.want {
			t.Errorf("TTL %v stored as %dms, want %dms", c.ttl, ms, c.want)
		}
	}
}

// A driver over the caller's database refuses every operation after Close
// (it used to go on granting leases), as the other SQL drivers do.
func TestClosedDriverOverCallersDB(t *testing.T) {
	ctx := context.Background()
	db := plainDB(t)
	d, err := fencedsqlite.New(ctx, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.TryAcquire(ctx, "k", "owner-1", time.Second); !errors.Is(err, fenced.ErrClosed) {
		t.Errorf("TryAcquire after Close: %v, want ErrClosed", err)
	}
	if _, err := d.List(ctx, ""); !errors.Is(err, fenced.ErrClosed) {
		t.Errorf("List after Close: %v, want ErrClosed", err)
	}
	if err := db.PingContext(ctx); err != nil {
		t.Errorf("Close closed the caller's database: %v", err)
	}
}

// The sqlite URL's query is read strictly, as the other SQL backends'
// are: an empty or repeated table= used to fall back to the default
// table, or to the first of two, unnoticed.
func TestURLQueryIsStrict(t *testing.T) {
	dir := t.TempDir()
	for _, q := range []string{"table=", "table=a&table=b", "busy_timeout=1s&busy_timeout=2s", "table=a;b", "tabel=a"} {
		u := "sqlite://" + filepath.Join(dir, "l.db") + "?" + q
		c, err := fenced.Open(context.Background(), u, nil)
		if err == nil {
			c.Close()
			t.Errorf("Open(%q) succeeded, want ErrInvalidURL", u)
			continue
		}
		if !errors.Is(err, fenced.ErrInvalidURL) {
			t.Errorf("Open(%q) = %v, want ErrInvalidURL", u, err)
		}
	}
}
