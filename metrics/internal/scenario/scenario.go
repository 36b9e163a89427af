// Package scenario drives the events every metrics exporter must report,
// against a real SQLite lease store and a real fence guard, so that the
// Prometheus and the OpenTelemetry tests check the same story:
//
//   - client A acquires invoice:inv_72 (Check "held": one lease held, its
//     least remaining validity exactly TTL − safety margin, since A runs
//     on a fake clock), is refused it again at once (held), and renews it
//     once (ok);
//   - client B waits for it for 100ms and gives up (timeout), then waits
//     again while an admin breaks A's lease: B is granted the key it found
//     held (an owner change), A's next renewal is refused (refused) and A
//     loses the lease (broken, read from the store's break log);
//   - B writes the invoice row with its fence; A's late write is refused
//     by the guard (a stale write, reported to A's hook through A's
//     token); B releases;
//   - A's report:daily lease, not renewed, expires after exactly its TTL of
//     1s on A's clock (expired, hold/TTL ratio 1); client C is closed
//     while holding report:weekly (closed).
//
// All three clients report to the same exporter under store "sqlite".
package scenario

import (
	"context"
	"database/sql"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/clock"
	"github.com/fenced-dev/fenced/fence"
	"github.com/fenced-dev/fenced/fencedsqlite"
	"github.com/fenced-dev/fenced/metrics"
)

// Store is the store label the scenario's clients report under.
const Store = "sqlite"

// TTL of A's invoice lease, and the validity it reports while nothing has
// moved A's fake clock: TTL minus the default safety margin TTL/100 + 2ms.
const (
	TTL      = 30 * time.Second
	Validity = TTL - TTL/100 - 2*time.Millisecond
)

// Run plays the scenario, reporting the clients' events to the hook that
// hook returns for a store name. held is called while A holds its invoice
// lease and nothing else is held.
func Run(t *testing.T, hook func(store string) func(fenced.Event), held func()) {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	open := func(clk clock.Clock, extra func(fenced.Event)) *fenced.Client {
		drv, err := fencedsqlite.OpenFile(ctx, filepath.Join(dir, "leases.db"), nil)
		if err != nil {
			t.Fatal(err)
		}
		c := fenced.NewClient(drv, &fenced.Options{Clock: clk, Hook: metrics.Join(hook(Store), extra), MaxBackoff: 50 * time.Millisecond})
		t.Cleanup(func() { c.Close() })
		return c
	}
	// B's second attempt comes after its first was refused.
	var bAttempt atomic.Int64
	seeRefusal := func(e fenced.Event) {
		if e.Kind == fenced.EventAttempt {
			bAttempt.Store(int64(e.Attempt))
		}
	}
	clk := clock.NewFake(time.Now())
	a, b, c := open(clk, nil), open(clock.Real(), seeRefusal), open(clock.Real(), nil)
	operator, err := fenced.Open(ctx, "sqlite://"+filepath.Join(dir, "leases.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer operator.Close()
	db, guard := invoices(t, filepath.Join(dir, "billing.db"))

	const key = "invoice:inv_72"
	la, err := a.TryAcquire(ctx, key, &fenced.LeaseOptions{TTL: TTL})
	if err != nil {
		t.Fatal(err)
	}
	held()
	if _, err := a.TryAcquire(ctx, key, nil); err == nil {
		t.Fatal("second TryAcquire of a held key succeeded")
	}
	advance(clk, TTL/3+time.Millisecond, TTL/3+time.Millisecond)
	waitFor(t, "A's first renewal", func() bool { return la.Remaining() > Validity-TTL/3 })

	if _, err := b.Acquire(ctx, key, &fenced.LeaseOptions{MaxWait: 100 * time.Millisecond}); err == nil {
		t.Fatal("B got a held key")
	}
	bAttempt.Store(0)
	granted := make(chan *fenced.Lease, 1)
	go func() {
		l, err := b.Acquire(ctx, key, &fenced.LeaseOptions{MaxWait: 20 * time.Second})
		if err != nil {
			t.Error(err)
		}
		granted <- l
	}()
	waitFor(t, "B to find the key held", func() bool { return bAttempt.Load() >= 2 })
	if _, err := operator.Break(ctx, key, "scenario", "metrics test"); err != nil {
		t.Fatal(err)
	}
	lb := <-granted
	if lb == nil {
		t.FailNow()
	}
	advance(clk, TTL/3+time.Millisecond, TTL/3+time.Millisecond)
	select {
	case <-la.Context().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("A did not lose its broken lease")
	}

	if r := write(t, db, guard, fence.From(lb)); r.Outcome != fence.Applied {
		t.Fatalf("B's write: %v", r.Outcome)
	}
	if r := write(t, db, guard, fence.From(la)); r.Outcome != fence.Stale {
		t.Fatalf("A's late write: %v, want stale", r.Outcome)
	}
	if err := lb.Release(ctx); err != nil {
		t.Fatal(err)
	}

	daily, err := a.TryAcquire(ctx, "report:daily", &fenced.LeaseOptions{TTL: time.Second, ManualRenew: true})
	if err != nil {
		t.Fatal(err)
	}
	for daily.Err() == nil {
		advance(clk, 100*time.Millisecond, 100*time.Millisecond)
	}
	if _, err := c.TryAcquire(ctx, "report:weekly", nil); err != nil {
		t.Fatal(err)
	}
	c.Close()
}

// advance moves clk by d in steps, letting woken goroutines run.
func advance(clk *clock.Fake, d, step time.Duration) {
	for moved := time.Duration(0); moved < d; moved += step {
		clk.Advance(min(step, d-moved))
		time.Sleep(20 * time.Millisecond)
	}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !ok(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func invoices(t *testing.T, path string) (*sql.DB, *fence.SQL) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.Exec(`CREATE TABLE invoices (id TEXT PRIMARY KEY, status TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO invoices VALUES ('inv_72', 'due')`); err != nil {
		t.Fatal(err)
	}
	guard, err := fence.NewSQL(db, fence.SQLite, fence.Table{Name: "invoices", Key: "id"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := guard.EnsureColumns(context.Background()); err != nil {
		t.Fatal(err)
	}
	return db, guard
}

func write(t *testing.T, db *sql.DB, guard *fence.SQL, tok fence.Token) fence.Result {
	t.Helper()
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	r, err := guard.Update(context.Background(), tx, "inv_72", tok, fence.Write{Set: "status = ?", SetArgs: []any{"sent"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return r
}
