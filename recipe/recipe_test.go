package recipe_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/drivertest"
	_ "github.com/fenced-dev/fenced/fencedsqlite"
	_ "github.com/fenced-dev/fenced/mem"
	"github.com/fenced-dev/fenced/recipe"
)

// openN opens n clients on one store, as n processes would.
func openN(t *testing.T, url string, n int) []*fenced.Client {
	t.Helper()
	ctx := context.Background()
	var cs []*fenced.Client
	for range n {
		c, err := fenced.Open(ctx, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		cs = append(cs, c)
	}
	return cs
}

func sqliteURL(t *testing.T) string {
	return "sqlite://" + filepath.Join(t.TempDir(), "leases.db")
}

// TestElectionOneLeaderEpochsAndNoLeader runs three candidates on SQLite:
// one leads at a time, each new leader has a higher epoch, and Observe
// reports every leader with "no leader" between any two.
func TestElectionOneLeaderEpochsAndNoLeader(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cs := openN(t, sqliteURL(t), 4)
	opts := &fenced.LeaseOptions{TTL: time.Second}
	obsEl, err := recipe.NewElection(cs[3], "leader", opts)
	if err != nil {
		t.Fatal(err)
	}
	octx, stopObs := context.WithCancel(ctx)
	var seen []recipe.Leader
	obsDone := make(chan struct{})
	go func() {
		defer close(obsDone)
		for l := range obsEl.Observe(octx) {
			seen = append(seen, l)
		}
	}()

	var leading atomic.Int32
	var mu sync.Mutex
	var epochs []uint64
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			el, err := recipe.NewElection(cs[i], "leader", opts)
			if err != nil {
				t.Error(err)
				return
			}
			for range 2 {
				ld, err := el.Campaign(ctx, "")
				if err != nil {
					t.Error(err)
					return
				}
				if n := leading.Add(1); n != 1 {
					t.Errorf("%d leaders at once", n)
				}
				mu.Lock()
				epochs = append(epochs, ld.Fence())
				mu.Unlock()
				time.Sleep(300 * time.Millisecond) // lead; observers read several times
				leading.Add(-1)
				if err := ld.Release(ctx); err != nil {
					t.Error(err)
				}
				time.Sleep(50 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	time.Sleep(2 * recipe.ObserveEvery)
	stopObs()
	<-obsDone
	for i := 1; i < len(epochs); i++ {
		if epochs[i] <= epochs[i-1] {
			t.Fatalf("epochs not increasing in leadership order: %v", epochs)
		}
	}
	// Every leader Observe reported was one of the terms, and any two
	// leaders were separated by a "no leader".
	var leaders []uint64
	for i, l := range seen {
		if !l.Present {
			continue
		}
		leaders = append(leaders, l.Epoch)
		if i > 0 && seen[i-1].Present {
			t.Fatalf("Observe went from %v to %v without no leader: %v", seen[i-1], l, seen)
		}
	}
	if len(leaders) < 2 {
		t.Fatalf("Observe saw %v; want several leaders", seen)
	}
	if last := seen[len(seen)-1]; last.Present {
		t.Fatalf("Observe ended on %v after every candidate resigned; want no leader", last)
	}
}

// TestElectionRunCallbacks checks the client-go-style form: the leader's
// OnStartedLeading context is cancelled when its lease is broken,
// OnStoppedLeading then reports the loss, and a candidate that never led
// never gets OnStoppedLeading.
func TestElectionRunCallbacks(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs := openN(t, sqliteURL(t), 2)
	opts := &fenced.LeaseOptions{TTL: 2 * time.Second}
	a, _ := recipe.NewElection(cs[0], "job", opts)
	b, _ := recipe.NewElection(cs[1], "job", opts)

	started := make(chan uint64, 1)
	var stoppedCause error
	var newLeaders []recipe.Leader
	var nlMu sync.Mutex
	runErr := make(chan error, 1)
	go func() {
		runErr <- a.Run(ctx, "", recipe.Callbacks{
			OnStartedLeading: func(ctx context.Context, l *recipe.Leadership) {
				started <- l.Fence()
				<-ctx.Done()
			},
			OnStoppedLeading: func(cause error) { stoppedCause = cause },
			OnNewLeader: func(l recipe.Leader) {
				nlMu.Lock()
				newLeaders = append(newLeaders, l)
				nlMu.Unlock()
			},
		})
	}()
	epoch := <-started

	bctx, bcancel := context.WithCancel(ctx)
	bStopped := false
	bErr := make(chan error, 1)
	go func() {
		bErr <- b.Run(bctx, "", recipe.Callbacks{
			OnStartedLeading: func(ctx context.Context, l *recipe.Leadership) {
				if l.Fence() <= epoch {
					t.Errorf("second leader epoch %d not above %d", l.Fence(), epoch)
				}
				bcancel() // step down at once
				<-ctx.Done()
			},
			OnStoppedLeading: func(error) { bStopped = true },
		})
	}()
	time.Sleep(300 * time.Millisecond)
	if _, err := cs[1].Break(ctx, "job", "test", "test"); err != nil {
		t.Fatal(err)
	}
	err := <-runErr
	if !fenced.IsLost(err) || !fenced.IsLost(stoppedCause) {
		t.Fatalf("Run = %v, OnStoppedLeading(%v); want a loss", err, stoppedCause)
	}
	if err := <-bErr; err != nil {
		t.Fatalf("b.Run = %v; want nil after resigning", err)
	}
	if !bStopped {
		t.Fatal("b led but OnStoppedLeading was not called")
	}
	nlMu.Lock()
	defer nlMu.Unlock()
	sawA := false
	for _, l := range newLeaders {
		sawA = sawA || l.Present && l.Epoch == epoch
	}
	if !sawA {
		t.Fatalf("OnNewLeader got %v; want a's epoch %d among them", newLeaders, epoch)
	}

	// A candidate that never leads is never told it stopped.
	c, _ := recipe.NewElection(cs[1], "other", opts)
	hold, err := recipe.NewElection(cs[0], "other", opts)
	if err != nil {
		t.Fatal(err)
	}
	ld, err := hold.Campaign(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	defer ld.Release(ctx)
	cctx, ccancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer ccancel()
	called := false
	if err := c.Run(cctx, "", recipe.Callbacks{OnStoppedLeading: func(error) { called = true }}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Run of a candidate that never led = %v", err)
	}
	if called {
		t.Fatal("OnStoppedLeading called for a process that never led")
	}
}

// TestElectionProclaim checks values on a backend with a value slot (mem)
// and the refusal on one without (SQLite).
func TestElectionProclaim(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs := openN(t, "mem://election-proclaim", 2)
	el, _ := recipe.NewElection(cs[0], "svc", nil)
	obs, _ := recipe.NewElection(cs[1], "svc", nil)
	ch := obs.Observe(ctx)
	if l := <-ch; l.Present {
		t.Fatalf("first state %v; want no leader", l)
	}
	ld, err := el.Campaign(ctx, "10.0.0.1:8080")
	if err != nil {
		t.Fatal(err)
	}
	if l := <-ch; !l.Present || l.Value != "10.0.0.1:8080" || l.Epoch != ld.Fence() {
		t.Fatalf("observed %v; want leader %d with its value", l, ld.Fence())
	}
	if err := ld.SetValue(ctx, "10.0.0.2:8080"); err != nil {
		t.Fatal(err)
	}
	if l := <-ch; l.Value != "10.0.0.2:8080" || l.Epoch != ld.Fence() {
		t.Fatalf("observed %v after Proclaim", l)
	}
	ld.Release(ctx)
	if l := <-ch; l.Present || l.Epoch != ld.Fence() {
		t.Fatalf("observed %v after Resign; want no leader, last epoch %d", l, ld.Fence())
	}
	if err := ld.SetValue(ctx, "x"); !errors.Is(err, fenced.ErrReleased) {
		t.Fatalf("Proclaim after Resign = %v", err)
	}

	sq := openN(t, sqliteURL(t), 1)[0]
	sel, _ := recipe.NewElection(sq, "svc", nil)
	if _, err := sel.Campaign(ctx, "v"); !errors.Is(err, fenced.ErrUnsupported) {
		t.Fatalf("Campaign with a value on SQLite = %v; want ErrUnsupported", err)
	}
	sld, err := sel.Campaign(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := sld.SetValue(ctx, "v"); !errors.Is(err, fenced.ErrUnsupported) {
		t.Fatalf("Proclaim on SQLite = %v; want ErrUnsupported", err)
	}
}

// TestSemaphoreLimitAndNoLeak runs six workers over three permits on
// SQLite: never more than three hold at once, the permits held at once
// are distinct, and a permit whose holder stops renewing (as a crashed
// holder does) comes back after its TTL.
func TestSemaphoreLimitAndNoLeak(t *testing.T) {
	url := sqliteURL(t)
	cs := openN(t, url, 6)
	// A TTL the six clients renew in time on this machine: a permit that
	// lapsed would make the check of distinct permits meaningless.
	ttl := drivertest.MeasuredTTL(t, time.Second, cs...)
	ctx, cancel := context.WithTimeout(context.Background(), max(60*time.Second, 30*ttl))
	defer cancel()
	opts := &fenced.LeaseOptions{TTL: ttl, MaxWait: fenced.WaitForever}
	var mu sync.Mutex
	inUse := map[int]bool{}
	maxSeen := 0
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem, err := recipe.NewSemaphore(cs[i], "pool", 3, opts)
			if err != nil {
				t.Error(err)
				return
			}
			for range 3 {
				p, err := sem.Acquire(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if inUse[p.Slot()] {
					t.Errorf("slot %d held twice", p.Slot())
				}
				inUse[p.Slot()] = true
				maxSeen = max(maxSeen, len(inUse))
				mu.Unlock()
				time.Sleep(20 * time.Millisecond)
				mu.Lock()
				delete(inUse, p.Slot())
				mu.Unlock()
				if err := p.Release(ctx); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if maxSeen > 3 || maxSeen == 0 {
		t.Fatalf("%d permits held at once, want at most 3", maxSeen)
	}

	// Three holders that never renew (ManualRenew stands in for a
	// crash): a fourth waits and gets a permit once their TTL ran out.
	crashed := openN(t, url, 1)[0]
	dead, _ := recipe.NewSemaphore(crashed, "pool", 3, &fenced.LeaseOptions{TTL: ttl, ManualRenew: true})
	fences := map[int]uint64{}
	for range 3 {
		p, err := dead.TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		fences[p.Slot()] = p.Fence()
	}
	sem, _ := recipe.NewSemaphore(cs[0], "pool", 3, opts)
	if _, err := sem.TryAcquire(ctx); !errors.Is(err, fenced.ErrHeld) {
		t.Fatalf("TryAcquire with every permit held = %v; want ErrHeld", err)
	}
	p, err := sem.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p.Fence() <= fences[p.Slot()] {
		t.Fatalf("permit %d fence %d not above the dead holder's %d", p.Slot(), p.Fence(), fences[p.Slot()])
	}
	if p.Key() != "pool#"+strconv.Itoa(p.Slot()) { // the key Semaphore documents
		t.Fatalf("permit key %q", p.Key())
	}
	p.Release(ctx)

	if _, err := recipe.NewSemaphore(cs[0], "pool", 0, nil); !errors.Is(err, fenced.ErrInvalidOptions) {
		t.Fatalf("zero permits = %v", err)
	}
}

// TestAcquireAllOrderAndAllOrNothing takes {a,b} and {b,a} in loops from
// two clients: they never overlap and never deadlock. A failed
// acquisition releases what it took, and losing one key cancels the
// set's context.
func TestAcquireAllOrderAndAllOrNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cs := openN(t, sqliteURL(t), 3)
	opts := &fenced.LeaseOptions{TTL: 2 * time.Second, MaxWait: 20 * time.Second}
	var inside atomic.Int32
	var wg sync.WaitGroup
	for i, keys := range [][]string{{"a", "b"}, {"b", "a"}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				set, err := recipe.AcquireAll(ctx, cs[i], keys, opts)
				if err != nil {
					t.Error(err)
					return
				}
				if n := inside.Add(1); n != 1 {
					t.Errorf("%d holders of {a,b} at once", n)
				}
				time.Sleep(5 * time.Millisecond)
				inside.Add(-1)
				if err := set.Release(ctx); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()

	// All or nothing: b is held elsewhere, so {a, b} fails and a is free.
	lb, err := cs[2].TryAcquire(ctx, "b", nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = recipe.AcquireAll(ctx, cs[0], []string{"b", "a"}, &fenced.LeaseOptions{MaxWait: 100 * time.Millisecond})
	if !errors.Is(err, fenced.ErrHeld) {
		t.Fatalf("AcquireAll with b held = %v; want ErrHeld", err)
	}
	if info, err := cs[0].Inspect(ctx, "a"); err != nil || info.Held {
		t.Fatalf("a after the failed AcquireAll: %+v, %v; want free", info, err)
	}
	lb.Release(ctx)

	set, err := recipe.AcquireAll(ctx, cs[0], []string{"b", "a"}, &fenced.LeaseOptions{TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, l := range set.Leases() {
		keys = append(keys, l.Key())
	}
	if got := fmt.Sprint(keys); got != "[a b]" {
		t.Fatalf("keys %s; want canonical order", got)
	}
	for _, l := range set.Leases() {
		if l.Fence() == 0 {
			t.Fatalf("%s has fence 0", l.Key())
		}
	}
	if _, err := cs[1].Break(ctx, "b", "test", "test"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-set.Context().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("losing b did not cancel the set's context")
	}
	if !fenced.IsLost(set.Err()) {
		t.Fatalf("set cause %v; want a loss", set.Err())
	}
	if err := set.Release(ctx); !errors.Is(err, fenced.ErrNotHeld) {
		t.Fatalf("Release after losing b = %v; want ErrNotHeld for b", err)
	}
	if info, _ := cs[0].Inspect(ctx, "a"); info.Held {
		t.Fatal("a still held after Release")
	}

	for _, bad := range [][]string{nil, {"a", "a"}, {"a", ""}} {
		if _, err := recipe.AcquireAll(ctx, cs[0], bad, nil); !errors.Is(err, fenced.ErrInvalidKey) {
			t.Fatalf("AcquireAll(%q) = %v; want ErrInvalidKey", bad, err)
		}
	}
}
