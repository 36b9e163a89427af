package intent_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fence"
	"github.com/fenced-dev/fenced/fencedsqlite"
	"github.com/fenced-dev/fenced/intent"
	"github.com/fenced-dev/fenced/internal/testkit/payprovider"
)

type env struct {
	leases *fenced.Client
	store  *intent.Store
	stale  chan fenced.Event
	db     *sql.DB
	d      fence.Dialect
}

// newEnv opens a SQLite lease store and an intent store with the default
// table on db (nil: the lease store's own SQLite file).
func newEnv(t *testing.T, db *sql.DB, d fence.Dialect) env {
	return newEnvWith(t, db, d, nil)
}

var tables atomic.Int64

// uniqueTable returns a table name no other test in this process uses, so
// that tests can share a server's database.
func uniqueTable() string { return fmt.Sprintf("intents_%d", tables.Add(1)) }

// newEnvWith is newEnv with store options (nil: the defaults). The
// options' Hooks are replaced by the env's stale channel.
func newEnvWith(t *testing.T, db *sql.DB, d fence.Dialect, opts *intent.Options) env {
	t.Helper()
	ctx := context.Background()
	drv, err := fencedsqlite.OpenFile(ctx, filepath.Join(t.TempDir(), "app.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	leases := fenced.NewClient(drv, nil)
	t.Cleanup(func() { leases.Close() })
	if db == nil {
		db, d = drv.DB(), fence.SQLite
	}
	e := env{leases: leases, stale: make(chan fenced.Event, 16), db: db, d: d}
	var o intent.Options
	if opts != nil {
		o = *opts
	}
	o.Hook = func(ev fenced.Event) {
		if ev.Kind == fenced.EventStaleWrite {
			e.stale <- ev
		}
	}
	e.store = e.newStore(t, &o)
	return e
}

// newStore opens another store on the env's database and ensures its
// table (twice, to show that it is idempotent).
func (e env) newStore(t *testing.T, opts *intent.Options) *intent.Store {
	t.Helper()
	ctx := context.Background()
	store, err := intent.New(e.db, e.d, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.EnsureTable(ctx); err != nil {
		t.Fatal(err)
	}
	if err := store.EnsureTable(ctx); err != nil {
		t.Fatalf("EnsureTable twice: %v", err)
	}
	return store
}

func tk(f uint64, owner string) fence.Token {
	return fence.Token{Key: "payout:po_1", Fence: f, Owner: owner}
}

func TestLifecycle(t *testing.T) { testLifecycle(t, newEnv(t, nil, 0)) }

func testLifecycle(t *testing.T, e env) {
	ctx := context.Background()
	s := e.store
	it, created, err := s.Create(ctx, "po_1", `{"amount_cents":500}`)
	if err != nil || !created || it.State != intent.Pending || it.IdempotencyKey != intent.DeriveKey("fenced", "po_1") {
		t.Fatalf("Create: %+v %v %v", it, created, err)
	}
	again, created, err := s.Create(ctx, "po_1", `{"amount_cents":500}`)
	if err != nil || created || again.IdempotencyKey != it.IdempotencyKey {
		t.Fatalf("Create again: %+v %v %v", again, created, err)
	}
	if _, _, err := s.Create(ctx, "po_1", `{"amount_cents":900}`); !errors.Is(err, intent.ErrConflict) {
		t.Fatalf("Create with another payload: %v, want ErrConflict", err)
	}
	if _, _, err := s.Create(ctx, "", "x"); err == nil {
		t.Fatal("empty id accepted")
	}
	// Complete before Begin is refused.
	if err := s.Complete(ctx, "po_1", tk(1, "a"), "ref"); !errors.Is(err, intent.ErrNotSubmitting) {
		t.Fatalf("Complete while pending: %v", err)
	}
	// A begins with fence 1; B (fence 2) re-enters submitting.
	it, err = s.Begin(ctx, "po_1", tk(1, "a"))
	if err != nil || it.State != intent.Submitting || it.Attempts != 1 || it.Fence != 1 {
		t.Fatalf("Begin by 1: %+v %v", it, err)
	}
	it, err = s.Begin(ctx, "po_1", tk(2, "b"))
	if err != nil || it.State != intent.Submitting || it.Attempts != 2 || it.Fence != 2 || it.IdempotencyKey != again.IdempotencyKey {
		t.Fatalf("Begin by 2: %+v %v", it, err)
	}
	// A's late record is refused as stale and reported.
	if err := s.Complete(ctx, "po_1", tk(1, "a"), "pay_A"); !errors.Is(err, fenced.ErrStaleFence) {
		t.Fatalf("stale Complete: %v", err)
	}
	select {
	case ev := <-e.stale:
		if ev.Fence != 1 || ev.Current != 2 || ev.Resource != s.Table() {
			t.Fatalf("stale event %+v", ev)
		}
	default:
		t.Fatal("stale Complete not reported")
	}
	if _, err := s.Begin(ctx, "po_1", tk(1, "a")); !errors.Is(err, fenced.ErrStaleFence) {
		t.Fatalf("stale Begin: %v", err)
	}
	if err := s.Complete(ctx, "po_1", tk(2, "b"), "pay_B"); err != nil {
		t.Fatal(err)
	}
	// Done: later attempts learn it without acting.
	it, err = s.Begin(ctx, "po_1", tk(3, "c"))
	if !errors.Is(err, intent.ErrResolved) || it.State != intent.Submitted || it.Ref != "pay_B" {
		t.Fatalf("Begin after submitted: %+v %v", it, err)
	}
	if err := s.Fail(ctx, "po_1", tk(3, "c"), "late"); !errors.Is(err, intent.ErrNotSubmitting) {
		t.Fatalf("Fail after submitted: %v", err)
	}
	// Bad input changes nothing.
	for _, bad := range []fence.Token{tk(0, "a"), tk(1<<63, "a"), tk(5, "")} {
		if _, err := s.Begin(ctx, "po_1", bad); !errors.Is(err, fence.ErrInvalidToken) {
			t.Errorf("Begin with %v: %v", bad, err)
		}
	}
	if _, err := s.Begin(ctx, "po_404", tk(9, "x")); !errors.Is(err, intent.ErrNotFound) {
		t.Errorf("Begin on a missing intent: %v", err)
	}
	final, err := s.Get(ctx, "po_1")
	if err != nil || final.State != intent.Submitted || final.Ref != "pay_B" || final.Fence != 2 || final.Attempts != 2 {
		t.Fatalf("final %+v %v", final, err)
	}
	// Fail path.
	s.Create(ctx, "po_2", "x")
	if _, err := s.Begin(ctx, "po_2", tk(1, "a")); err != nil {
		t.Fatal(err)
	}
	if err := s.Fail(ctx, "po_2", tk(1, "a"), "card declined"); err != nil {
		t.Fatal(err)
	}
	if it, _ := s.Get(ctx, "po_2"); it.State != intent.Failed || it.Reason != "card declined" {
		t.Fatalf("failed intent %+v", it)
	}
	if _, err := intent.New(nil, fence.SQLite, &intent.Options{Table: "bad name"}); err == nil || !strings.Contains(err.Error(), "bad name") {
		t.Fatalf("bad table name: %v", err)
	}
}

// TestReconcile: intents stuck in submitting are resolved by asking the
// provider by idempotency key, without paying again.
func TestReconcile(t *testing.T) { testReconcile(t, newEnv(t, nil, 0)) }

func testReconcile(t *testing.T, e env) {
	ctx := context.Background()
	s := e.store
	provider := payprovider.Start()
	defer provider.Close()
	pay := &payprovider.Client{URL: provider.URL()}
	leaseKey := func(id string) string { return "payout:" + id }

	// begin starts an attempt whose worker then crashes (its lease is
	// released, as by a restart; the record stays submitting).
	begin := func(id string) intent.Intent {
		t.Helper()
		if _, _, err := s.Create(ctx, id, "x"); err != nil {
			t.Fatal(err)
		}
		l, err := e.leases.Acquire(ctx, leaseKey(id), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release(ctx)
		it, err := s.Begin(ctx, id, fence.From(l))
		if err != nil {
			t.Fatal(err)
		}
		return it
	}
	paid := begin("paid") // the provider paid, the answer was lost
	if _, err := pay.Pay(ctx, paid.IdempotencyKey, "paid", 100); err != nil {
		t.Fatal(err)
	}
	rejected := begin("rejected") // the provider refused it
	if _, err := pay.Pay(ctx, rejected.IdempotencyKey, "rejected", -1); !errors.Is(err, payprovider.ErrRejected) {
		t.Fatal(err)
	}
	begin("lost") // the request never reached the provider
	begin("busy") // its worker is still active (holds the lease)
	busy, err := e.leases.Acquire(ctx, leaseKey("busy"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Release(ctx)
	s.Create(ctx, "fresh", "x") // pending: not stuck

	rec := &intent.Reconciler{
		Store: s, Leases: e.leases, LeaseKey: leaseKey, StuckFor: 200 * time.Millisecond,
		Lookup: func(ctx context.Context, it intent.Intent) (intent.Answer, error) {
			ref, err := pay.Lookup(ctx, it.IdempotencyKey)
			switch {
			case err == nil:
				return intent.Answer{Finding: intent.Done, Ref: ref}, nil
			case errors.Is(err, payprovider.ErrNotFound):
				return intent.Answer{Finding: intent.Absent}, nil
			case errors.Is(err, payprovider.ErrRejected):
				return intent.Answer{Finding: intent.Rejected, Reason: err.Error()}, nil
			}
			return intent.Answer{}, err
		},
	}
	// Not stuck long enough yet (by the database's clock): nothing examined.
	early := *rec
	early.StuckFor = time.Hour
	if rep, err := early.RunOnce(ctx); err != nil || rep.Examined != 0 {
		t.Fatalf("early run: %+v %v", rep, err)
	}
	time.Sleep(300 * time.Millisecond)
	rep, err := rec.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep != (intent.Report{Examined: 4, Submitted: 1, Failed: 1, Reopened: 1, Skipped: 1}) {
		t.Fatalf("report %+v", rep)
	}
	want := map[string]intent.State{"paid": intent.Submitted, "rejected": intent.Failed, "lost": intent.Pending, "busy": intent.Submitting, "fresh": intent.Pending}
	for id, st := range want {
		it, err := s.Get(ctx, id)
		if err != nil || it.State != st {
			t.Errorf("%s: %+v %v, want %s", id, it, err, st)
		}
	}
	if it, _ := s.Get(ctx, "paid"); it.Ref != "pay_1" {
		t.Errorf("paid ref %q", it.Ref)
	}
	if n := len(provider.Payouts()); n != 1 {
		t.Fatalf("provider paid %d times, want 1", n)
	}
	// The reopened intent is retried with the same key; a late delivery of
	// the lost request would be deduplicated by it.
	l, err := e.leases.Acquire(ctx, leaseKey("lost"), nil)
	if err != nil {
		t.Fatal(err)
	}
	it, err := s.Begin(ctx, "lost", fence.From(l))
	if err != nil || it.IdempotencyKey != intent.DeriveKey("fenced", "lost") || it.Attempts != 2 {
		t.Fatalf("retry of lost: %+v %v", it, err)
	}
	l.Release(ctx)
	if _, err := (&intent.Reconciler{Store: s}).RunOnce(ctx); err == nil {
		t.Fatal("incomplete Reconciler accepted")
	}
}

// TestReconcilerRun: the periodic runner resolves a stuck intent, reports
// lookup failures to onErr and leaves the intent for the next run, and stops
// with the context.
func TestReconcilerRun(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := newEnv(t, nil, 0)
	s := e.store
	s.Create(ctx, "po_9", "x")
	l, err := e.leases.Acquire(ctx, "payout:po_9", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Begin(ctx, "po_9", fence.From(l)); err != nil {
		t.Fatal(err)
	}
	l.Release(ctx)
	lookups := make(chan struct{}, 100)
	failFirst := true
	errs := make(chan error, 100)
	rec := &intent.Reconciler{
		Store: s, Leases: e.leases, LeaseKey: func(id string) string { return "payout:" + id }, StuckFor: time.Millisecond,
		Lookup: func(ctx context.Context, it intent.Intent) (intent.Answer, error) {
			lookups <- struct{}{}
			if failFirst {
				failFirst = false
				return intent.Answer{}, errors.New("provider timeout")
			}
			return intent.Answer{Finding: intent.Done, Ref: "pay_77"}, nil
		},
	}
	done := make(chan error, 1)
	go func() { done <- rec.Run(ctx, 20*time.Millisecond, func(err error) { errs <- err }) }()
	deadline := time.After(20 * time.Second)
	for {
		it, err := s.Get(ctx, "po_9")
		if err != nil {
			t.Fatal(err)
		}
		if it.State == intent.Submitted {
			if it.Ref != "pay_77" {
				t.Fatalf("ref %q", it.Ref)
			}
			break
		}
		select {
		case <-deadline:
			t.Fatalf("not resolved: %+v", it)
		case <-time.After(20 * time.Millisecond):
		}
	}
	select {
	case err := <-errs:
		if !strings.Contains(err.Error(), "provider timeout") {
			t.Fatalf("onErr got %v", err)
		}
	default:
		t.Fatal("the failed lookup was not reported")
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run returned %v", err)
	}
	if len(lookups) < 2 {
		t.Fatalf("%d lookups", len(lookups))
	}
	if _, err := (&intent.Reconciler{Store: s, Leases: e.leases, LeaseKey: rec.LeaseKey, Lookup: rec.Lookup}).RunOnce(ctx); err == nil || !strings.Contains(err.Error(), "StuckFor") {
		t.Fatalf("zero StuckFor: %v", err)
	}
}
