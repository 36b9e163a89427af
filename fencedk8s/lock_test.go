package fencedk8s_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedk8s"
)

func openSQLite(t *testing.T) *fenced.Client {
	t.Helper()
	c, err := fenced.Open(context.Background(), "sqlite://"+filepath.Join(t.TempDir(), "leases.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func newLock(t *testing.T, c *fenced.Client, identity string) *fencedk8s.ResourceLock {
	t.Helper()
	l, err := fencedk8s.New(c, "election", identity, &fencedk8s.Options{RenewDeadline: time.Second, RetryPeriod: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func record(identity string) resourcelock.LeaderElectionRecord {
	return resourcelock.LeaderElectionRecord{HolderIdentity: identity, LeaseDurationSeconds: 2}
}

// TestGetNamesTheLeader: another candidate's Get names the leader by its
// identity, as client-go's OnNewLeader and logs show it, and never shows
// the leader's owner token. It named it "fenced:<owner prefix>" before.
func TestGetNamesTheLeader(t *testing.T) {
	ctx := context.Background()
	c := openSQLite(t)
	a, b := newLock(t, c, "replica-a"), newLock(t, c, "replica-b")
	if err := a.Update(ctx, record("replica-a")); err != nil {
		t.Fatal(err)
	}
	owner := a.Lease().Owner()
	// The name is written beside the elector, just after the grant: wait
	// for it (this bound only catches a hang).
	var got string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		rec, raw, err := b.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(raw), owner) || strings.Contains(rec.HolderIdentity, owner) {
			t.Fatalf("Get shows the owner token: %s %+v", raw, rec)
		}
		if got = rec.HolderIdentity; got == "replica-a" {
			break
		}
	}
	if got != "replica-a" {
		t.Fatalf("another candidate sees the leader as %q, want its identity replica-a", got)
	}
	// A new term is named afresh.
	if err := a.Update(ctx, resourcelock.LeaderElectionRecord{}); err != nil {
		t.Fatal(err)
	}
	// The release goes to the store in the background, as the elector's
	// ReleaseOnCancel does: b's campaign finds the key held until it has,
	// and tries again as the elector would (this bound only catches a hang).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		err := b.Update(ctx, record("replica-b"))
		if err == nil {
			break
		}
		if !errors.Is(err, fenced.ErrHeld) || time.Now().After(deadline) {
			t.Fatalf("b's campaign after a's release: %v", err)
		}
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		rec, _, err := a.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got = rec.HolderIdentity; got == "replica-b" {
			return
		}
	}
	t.Fatalf("after the hand-over the leader is seen as %q, want replica-b", got)
}

// TestTermRenewsOnlyItsLease: once the elector leads, Update renews that
// term's lease at the store and never takes a new one: a term whose lease
// was lost fails (ErrTermEnded) until the elector ends it, and Get does
// not ask the store meanwhile. A new campaign then gets a new fence.
func TestTermRenewsOnlyItsLease(t *testing.T) {
	ctx := context.Background()
	c := openSQLite(t)
	a := newLock(t, c, "replica-a")
	if err := a.Update(ctx, record("replica-a")); err != nil {
		t.Fatal(err)
	}
	a.RecordEvent("became leader")
	l := a.Lease()
	if err := a.Update(ctx, record("replica-a")); err != nil {
		t.Fatalf("renewal: %v", err)
	}
	if err := l.Release(ctx); err != nil { // the lease ends under the term
		t.Fatal(err)
	}
	if err := a.Update(ctx, record("replica-a")); !errors.Is(err, fencedk8s.ErrTermEnded) {
		t.Fatalf("renewal of an ended term: %v, want ErrTermEnded", err)
	}
	if _, _, err := a.Get(ctx); !errors.Is(err, fencedk8s.ErrTermEnded) {
		t.Fatalf("Get in an ended term: %v, want ErrTermEnded", err)
	}
	a.RecordEvent("stopped leading")
	if err := a.Update(ctx, record("replica-a")); err != nil {
		t.Fatalf("new campaign: %v", err)
	}
	if f := a.Epoch(); f <= l.Fence() {
		t.Fatalf("new term's fence %d, want above %d", f, l.Fence())
	}
}

// TestRenewalRefusedPastTheLock: a renewal whose context gives the elector
// longer than Options.RenewDeadline is refused (ErrTiming), naming the
// option: the elector's term could outlive the lease.
func TestRenewalRefusedPastTheLock(t *testing.T) {
	ctx := context.Background()
	c := openSQLite(t)
	a := newLock(t, c, "replica-a")
	if err := a.Update(ctx, record("replica-a")); err != nil {
		t.Fatal(err)
	}
	a.RecordEvent("became leader")
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second) // an elector with RenewDeadline 5s
	defer cancel()
	err := a.Update(pctx, record("replica-a"))
	if !errors.Is(err, fencedk8s.ErrTiming) || !strings.Contains(err.Error(), "Options.RenewDeadline") {
		t.Fatalf("renewal with a 5s deadline on a lock told 1s: %v, want ErrTiming naming Options.RenewDeadline", err)
	}
	pctx, cancel = context.WithTimeout(ctx, 900*time.Millisecond)
	defer cancel()
	if err := a.Update(pctx, record("replica-a")); err != nil {
		t.Fatalf("renewal within RenewDeadline: %v", err)
	}
	if left, ttl := a.Lease().Remaining(), a.Lease().Options().TTL; left < 1200*time.Millisecond || ttl < 2*time.Second {
		t.Fatalf("after a renewal the lease has %v left of TTL %v, want at least RetryPeriod + RenewDeadline", left, ttl)
	}
}
