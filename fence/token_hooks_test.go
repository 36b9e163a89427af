package fence_test

import (
	"context"
	"testing"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fence"
	"github.com/fenced-dev/fenced/mem"
)

// TestGuardReportsToIssuingClient: a guard created without hooks reports a
// stale write to the hooks of the client that granted the token's lease, so
// one guard serves workers of several clients. Before, such a guard
// reported nothing, and a program needed one guard with hooks per client
// besides the one it used for set-up.
func TestGuardReportsToIssuingClient(t *testing.T) {
	ctx := context.Background()
	db := openSQLite(t)
	if _, err := db.Exec(`CREATE TABLE invoice_jobs (job_id TEXT PRIMARY KEY, status TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO invoice_jobs (job_id, status) VALUES ('inv_72', 'PENDING')`); err != nil {
		t.Fatal(err)
	}
	store := mem.NewStore(nil) // one authority, two clients with their own hooks
	var staleA, staleB, staleGuard []fenced.Event
	a := fenced.NewClient(store.Driver(), &fenced.Options{Hook: func(e fenced.Event) {
		if e.Kind == fenced.EventStaleWrite {
			staleA = append(staleA, e)
		}
	}})
	defer a.Close()
	b := fenced.NewClient(store.Driver(), &fenced.Options{Hook: func(e fenced.Event) {
		if e.Kind == fenced.EventStaleWrite {
			staleB = append(staleB, e)
		}
	}})
	defer b.Close()

	table := fence.Table{Name: "invoice_jobs", Key: "job_id"}
	guard, err := fence.NewSQL(db, fence.SQLite, table, nil) // no hooks
	if err != nil {
		t.Fatal(err)
	}
	if err := guard.EnsureColumns(ctx); err != nil {
		t.Fatal(err)
	}
	withHooks, err := fence.NewSQL(db, fence.SQLite, table, &fence.SQLOptions{Hook: func(e fenced.Event) {
		if e.Kind == fenced.EventStaleWrite {
			staleGuard = append(staleGuard, e)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}

	// tokenOf returns the token of a lease from c, released at once so
	// that the next lease gets a higher fence.
	tokenOf := func(c *fenced.Client) fence.Token {
		l, err := c.TryAcquire(ctx, "invoice:inv_72", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release(ctx)
		return fence.From(l)
	}
	oldA, oldB, newest := tokenOf(a), tokenOf(b), tokenOf(a)
	if res, err := guard.Claim(ctx, nil, "inv_72", newest); err != nil || !res.Applied() {
		t.Fatalf("claim by the newest holder: %+v %v", res, err)
	}
	for _, tok := range []fence.Token{oldA, oldB} {
		if res, err := guard.Claim(ctx, nil, "inv_72", tok); err != nil || res.Outcome != fence.Stale {
			t.Fatalf("stale claim with fence %d: %+v %v", tok.Fence, res, err)
		}
	}
	if len(staleA) != 1 || staleA[0].Fence != oldA.Fence || staleA[0].Current != newest.Fence || staleA[0].Key != "invoice:inv_72" || staleA[0].Resource != "invoice_jobs" {
		t.Fatalf("client A's hook got %+v", staleA)
	}
	if len(staleB) != 1 || staleB[0].Fence != oldB.Fence {
		t.Fatalf("client B's hook got %+v", staleB)
	}
	// A guard's own hooks take precedence: nothing goes to the client too.
	if res, _ := withHooks.Claim(ctx, nil, "inv_72", oldA); res.Outcome != fence.Stale {
		t.Fatalf("stale claim through the guard with hooks: %+v", res)
	}
	if len(staleGuard) != 1 || len(staleA) != 1 {
		t.Fatalf("guard hooks %d events, client A %d; want 1 and still 1", len(staleGuard), len(staleA))
	}
	// A token built by hand has no issuer: only a guard's hooks see it.
	hand := fence.Token{Key: oldA.Key, Fence: oldA.Fence, Owner: oldA.Owner}
	if res, _ := guard.Claim(ctx, nil, "inv_72", hand); res.Outcome != fence.Stale || len(staleA) != 1 {
		t.Fatalf("hand-made stale token: %+v, client A events %d", res, len(staleA))
	}
}
