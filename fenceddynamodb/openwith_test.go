package fenceddynamodb_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/clock"
	"github.com/fenced-dev/fenced/fenceddynamodb"
)

// TestOpenWithTakesTheClock opens a driver from a URL with a fake clock
// and checks that its watch of another owner's grant runs on that clock:
// a grant with an hour's TTL is taken over once the fake clock has moved
// an hour, with no real hour spent.
func TestOpenWithTakesTheClock(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	key := uniqueKey("openwith")
	holder := open(t)
	first, err := holder.TryAcquire(ctx, key, "hold0000000000000000000000000000", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	fake := clock.NewFake(time.Unix(1e9, 0))
	w, err := fenceddynamodb.OpenWith(ctx, server.URL(table, ""), &fenceddynamodb.Options{Clock: fake, Table: "ignored_table"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if w.Table() != table {
		t.Errorf("Table() = %q; want the URL's %q (opts.Table is ignored)", w.Table(), table)
	}
	const owner = "wait0000000000000000000000000000"
	if _, err := w.TryAcquire(ctx, key, owner, time.Hour); !errors.Is(err, fenced.ErrHeld) {
		t.Fatalf("first look at a live grant: %v; want ErrHeld", err)
	}
	fake.Advance(time.Hour + time.Millisecond)
	fence, err := w.TryAcquire(ctx, key, owner, time.Hour)
	if err != nil {
		t.Fatalf("after an hour on the driver's clock: %v; want the grant taken over (the clock did not reach the driver)", err)
	}
	if fence <= first {
		t.Errorf("fence %d after takeover, want > %d", fence, first)
	}
}
