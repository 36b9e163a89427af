package fencedpostgres_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenced-dev/fenced/driver"
)

// drain returns the indexes of subs with a wake-up pending after d.
func drain(subs []driver.Subscription, d time.Duration) []int {
	time.Sleep(d)
	var got []int
	for i, s := range subs {
		select {
		case <-s.C():
			got = append(got, i)
		default:
		}
	}
	return got
}

// Waiters in several drivers (processes) form one line per key: a release
// wakes one of them, not one per driver; a head that leaves, or whose
// session ends (its process died), lets the next driver's waiter look.
func TestOneWaiterPerReleaseAcrossDrivers(t *testing.T) {
	ctx := ctxT(t)
	const params = "table=line_leases"
	holder := open(t, params)
	key := "line:" + t.Name()
	var subs []driver.Subscription
	for range 4 {
		d := open(t, params)
		s, err := d.Subscribe(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		subs = append(subs, s)
	}
	f, err := holder.TryAcquire(ctx, key, "holder", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// The first driver to take the line's lock is head and lets its
	// waiter look once; the others wait their turn without looking.
	head := drain(subs, 2*time.Second)
	if len(head) != 1 {
		t.Fatalf("waiters %v were woken as heads of one line, want exactly one", head)
	}
	if err := holder.Release(ctx, driver.Grant{Key: key, Owner: "holder", Fence: f}); err != nil {
		t.Fatal(err)
	}
	if got := drain(subs, time.Second); len(got) != 1 || got[0] != head[0] {
		t.Fatalf("a release woke waiters %v, want only the head %d", got, head[0])
	}
	// The head's waiter leaves without the key: the next driver heads the
	// line and its waiter looks.
	subs[head[0]].Close()
	next := drain(subs, 2*time.Second)
	if len(next) != 1 || next[0] == head[0] {
		t.Fatalf("after the head left, waiters %v were woken, want one other waiter", next)
	}
	// The new head's session ends (as when its process dies): another
	// driver's waiter becomes head and looks.
	admin, err := pgx.Connect(ctx, pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	var killed int
	if err := admin.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
 WHERE query = 'LISTEN "line_leases_free"' AND pid IN (SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted)`).Scan(&killed); err != nil {
		t.Fatal(err)
	}
	if killed != 1 {
		t.Fatalf("terminated %d listening heads, want 1", killed)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := drain(subs, 100*time.Millisecond)
		other := false
		for _, i := range got {
			other = other || (i != next[0] && i != head[0])
		}
		if other {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no other driver's waiter looked after the head's session ended")
		}
	}
}
