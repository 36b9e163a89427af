package fencedpostgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenced-dev/fenced"
)

// TestAbandonedAcquireIsNotAppliedLater: an acquire whose caller gave up
// while its statement waited for another transaction is not applied once
// that transaction ends. Here the other transaction inserted the key's
// first row and stays open, so the acquire's insert waits on the primary
// key. When a query's context ends, pgx closes the connection and sends
// the server a cancel request, which ends the waiting statement; a server
// left to find out alone would run it once the lock goes, however long
// after, granting the key for its whole TTL to an owner nobody holds (the
// client looks for such a grant for a second only).
func TestAbandonedAcquireIsNotAppliedLater(t *testing.T) {
	ctx := ctxT(t)
	d := open(t)
	const key = "abandoned-late"
	conn, err := pgx.Connect(ctx, pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, "INSERT INTO "+pgx.Identifier{d.Table()}.Sanitize()+" (lease_key, owner, fence, expires_at) VALUES ($1, '', 1, now())", key); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	began := time.Now()
	_, err = d.TryAcquire(short, key, "owner-abandoned-0000000000000000000", time.Minute)
	cancel()
	if err == nil || !errors.Is(short.Err(), context.DeadlineExceeded) {
		t.Fatalf("acquire behind an uncommitted insert: %v after %v; want its context's end", err, time.Since(began))
	}
	if took := time.Since(began); took > 2*time.Second {
		t.Fatalf("acquire returned %v after its context ended at 300ms", took)
	}
	// Longer than the client's last look for an abandoned grant (1 s).
	time.Sleep(1500 * time.Millisecond)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	info, err := d.Inspect(ctx, key)
	if errors.Is(err, fenced.ErrNotFound) {
		return // no row: nothing was granted
	}
	if err != nil {
		t.Fatal(err)
	}
	if info.Held {
		t.Fatalf("the abandoned acquire was applied once the other transaction ended: %+v", info)
	}
}
