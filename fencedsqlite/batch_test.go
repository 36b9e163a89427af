package fencedsqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/fencedsqlite"
)

// TestRenewBatchBeyondVariableLimit renews 9 000 grants in one RenewBatch:
// more than one statement's 32766 bound variables hold (4 per grant), which
// used to fail the whole batch. Every tenth grant is stale (wrong fence)
// and must be refused alone. The grants last an hour, so that none lapses
// while 9 000 are granted on a loaded machine (over a minute was seen),
// and the renewal asks for three.
func TestRenewBatchBeyondVariableLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("long: 9 000 grants in one batch; run without -short")
	}
	ctx := context.Background()
	// Without fsync, so that 9 000 grants take a second, not twenty.
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "l.db")+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(wal)&_pragma=synchronous(off)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	d, err := fencedsqlite.New(ctx, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	const n = 9000
	grants := make([]driver.Grant, n)
	for i := range grants {
		k, o := fmt.Sprintf("k%d", i), fmt.Sprintf("owner-%d-0123456789abcdef", i)
		f, err := d.TryAcquire(ctx, k, o, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		grants[i] = driver.Grant{Key: k, Owner: o, Fence: f, TTL: 3 * time.Hour}
		if i%10 == 0 {
			grants[i].Fence++
		}
	}
	errs, err := d.RenewBatch(ctx, grants)
	if err != nil {
		t.Fatal(err)
	}
	if len(errs) != n {
		t.Fatalf("%d results for %d grants", len(errs), n)
	}
	for i, e := range errs {
		if stale := i%10 == 0; stale != errors.Is(e, fenced.ErrNotHeld) || (!stale && e != nil) {
			t.Fatalf("grant %d (stale %v): %v", i, stale, e)
		}
	}
	info, err := d.Inspect(ctx, "k8999")
	if err != nil {
		t.Fatal(err)
	}
	if info.Remaining < 2*time.Hour {
		t.Fatalf("the last grant of the batch was not renewed: %+v", info)
	}
}
