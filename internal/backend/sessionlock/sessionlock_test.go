package sessionlock

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
)

type testEntry struct {
	Tracking
	id ID
}

func (e *testEntry) GrantID() ID { return e.id }

func TestGrantsTrackLookupForget(t *testing.T) {
	var mu sync.Mutex
	var ended, forgot []*testEntry
	g := NewGrants(func(e *testEntry) error {
		mu.Lock()
		defer mu.Unlock()
		ended = append(ended, e)
		return nil
	}, func(e *testEntry) {
		mu.Lock()
		defer mu.Unlock()
		forgot = append(forgot, e)
	})
	defer g.Close()
	a := &testEntry{id: ID{"k", "o"}}
	g.Track(a, time.Hour, time.Now())
	if got := g.Lookup("k", "o"); got != a {
		t.Fatalf("Lookup = %v, want %v", got, a)
	}
	// A newer entry for the same grant replaces the older; forgetting the
	// older then leaves the newer in place.
	b := &testEntry{id: ID{"k", "o"}}
	g.Track(b, time.Hour, time.Now())
	g.Forget(a)
	if got := g.Lookup("k", "o"); got != b {
		t.Fatalf("Lookup after forgetting the replaced entry = %v, want %v", got, b)
	}
	if _, ok := g.Deadline(a); ok {
		t.Fatal("the replaced entry's deadline is still armed")
	}
	g.Forget(b)
	if got := g.Lookup("k", "o"); got != nil {
		t.Fatalf("Lookup after Forget = %v, want nil", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(ended) != 0 || len(forgot) != 2 {
		t.Fatalf("ended %d, forgot %d; want 0 and 2", len(ended), len(forgot))
	}
}

func TestGrantsEndAtDeadlineAndRetry(t *testing.T) {
	ends := make(chan *testEntry, 4)
	fails := 1
	var mu sync.Mutex
	g := NewGrants(func(e *testEntry) error {
		mu.Lock()
		defer mu.Unlock()
		ends <- e
		if fails > 0 {
			fails--
			return errors.New("store down")
		}
		return nil
	}, nil)
	defer g.Close()
	e := &testEntry{id: ID{"k", "o"}}
	g.Track(e, 10*time.Millisecond, time.Now())
	for range 2 { // one failure, then the retry a second later
		select {
		case got := <-ends:
			if got != e {
				t.Fatalf("ended %v, want %v", got, e)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the entry was not ended at its deadline and retried")
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for g.Lookup("k", "o") != nil {
		if time.Now().After(deadline) {
			t.Fatal("an ended entry is still tracked")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestGrantsSealStopsTracking(t *testing.T) {
	g := NewGrants(func(*testEntry) error { return nil }, nil)
	defer g.Close()
	a := &testEntry{id: ID{"a", "o"}}
	g.Track(a, time.Hour, time.Now())
	left := g.Seal()
	if len(left) != 1 || left[0] != a {
		t.Fatalf("Seal = %v, want [%v]", left, a)
	}
	g.Track(&testEntry{id: ID{"b", "o"}}, time.Hour, time.Now())
	if g.Lookup("b", "o") != nil {
		t.Fatal("Track recorded an entry after Seal")
	}
}

func TestWaitTurn(t *testing.T) {
	transient := errors.New("transient")
	final := errors.New("final")
	retry := func(err error) bool { return errors.Is(err, transient) }

	t.Run("granted after waits and transient failures", func(t *testing.T) {
		steps := []error{nil, transient, nil}
		n := 0
		err := WaitTurn(context.Background(), func(context.Context) (bool, error) {
			if n < len(steps) {
				n++
				return false, steps[n-1]
			}
			return true, nil
		}, retry)
		if err != nil || n != len(steps) {
			t.Fatalf("WaitTurn = %v after %d steps, want nil after %d", err, n, len(steps))
		}
	})
	t.Run("final error ends the wait", func(t *testing.T) {
		err := WaitTurn(context.Background(), func(context.Context) (bool, error) { return false, final }, retry)
		if !errors.Is(err, final) {
			t.Fatalf("WaitTurn = %v, want %v", err, final)
		}
	})
	t.Run("context cause wins over a step error", func(t *testing.T) {
		cause := errors.New("caller gave up")
		ctx, cancel := context.WithCancelCause(context.Background())
		err := WaitTurn(ctx, func(context.Context) (bool, error) {
			cancel(cause)
			return false, transient
		}, retry)
		if !errors.Is(err, cause) {
			t.Fatalf("WaitTurn = %v, want the context's cause", err)
		}
	})
}

func TestLoss(t *testing.T) {
	reports := make(chan error, 2)
	l := NewLoss(func(err error) { reports <- err })
	l.Report(fenced.ErrLost)
	l.Report(fenced.ErrLost)
	if len(reports) != 1 {
		t.Fatalf("%d reports, want exactly one", len(reports))
	}
	stopped := NewLoss(func(err error) { reports <- err })
	stopped.Stop()
	stopped.Report(fenced.ErrLost)
	if len(reports) != 1 {
		t.Fatal("a report after Stop")
	}
}

func TestEndpoints(t *testing.T) {
	got, err := Endpoints("a:1,b:2", "server")
	if err != nil || len(got) != 2 || got[0] != "a:1" || got[1] != "b:2" {
		t.Fatalf("Endpoints = %v, %v", got, err)
	}
	for _, bad := range []string{"a", ":1", "a:0", "a:x", "a:1,", "a:70000"} {
		if _, err := Endpoints(bad, "server"); !errors.Is(err, fenced.ErrInvalidURL) {
			t.Errorf("Endpoints(%q) = %v, want ErrInvalidURL", bad, err)
		}
	}
}

// TestGrantsEndedEntryNeverComesBack checks that an entry that was
// forgotten, or ended, is refused by Extend and Track from then on: a
// renewal or an acquisition that raced its end cannot register it again.
func TestGrantsEndedEntryNeverComesBack(t *testing.T) {
	var mu sync.Mutex
	forgot := map[*testEntry]int{}
	g := NewGrants(func(*testEntry) error { return nil }, func(e *testEntry) {
		mu.Lock()
		defer mu.Unlock()
		forgot[e]++
	})
	defer g.Close()
	a := &testEntry{id: ID{"a", "o"}}
	if !g.Track(a, time.Hour, time.Now()) || !g.Extend(a, time.Hour, time.Now()) {
		t.Fatal("a new entry was not tracked and extended")
	}
	if g.Track(a, time.Hour, time.Now()) {
		t.Fatal("Track of an entry already tracked succeeded")
	}
	g.Forget(a)
	b := &testEntry{id: ID{"b", "o"}}
	g.Track(b, time.Hour, time.Now())
	g.EndNow(b)
	c := &testEntry{id: ID{"c", "o"}}
	g.Track(c, 10*time.Millisecond, time.Now())
	deadline := time.Now().Add(5 * time.Second)
	for g.Lookup("c", "o") != nil {
		if time.Now().After(deadline) {
			t.Fatal("the reaper did not end c")
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, e := range []*testEntry{a, b, c} {
		if g.Extend(e, time.Hour, time.Now()) || g.Track(e, time.Hour, time.Now()) {
			t.Fatalf("%v came back after it ended", e.id)
		}
		if got := g.Lookup(e.id.Key, e.id.Owner); got != nil {
			t.Fatalf("Lookup(%v) = %v after it ended", e.id, got)
		}
		g.Forget(e)
		g.EndNow(e)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, e := range []*testEntry{a, b, c} {
		if forgot[e] != 1 {
			t.Fatalf("%v forgotten %d times, want once", e.id, forgot[e])
		}
	}
}

// TestGrantsExtendBeatsDueReap checks that an entry extended after its
// deadline passed, but before the reaper claimed it, is not ended.
func TestGrantsExtendBeatsDueReap(t *testing.T) {
	ended := make(chan struct{}, 1)
	var g *Grants[*testEntry]
	e := &testEntry{id: ID{"k", "o"}}
	g = NewGrants(func(*testEntry) error { ended <- struct{}{}; return nil }, nil)
	defer g.Close()
	g.Track(e, time.Hour, time.Now())
	// Due now, extended before the reaper's end runs: g.reap sees the
	// moved deadline and leaves e alone.
	g.mu.Lock()
	g.reaper.Set(e, time.Now().Add(-time.Second))
	g.reaper.Set(e, time.Now().Add(time.Hour))
	g.mu.Unlock()
	if err := g.reap([]*testEntry{e})[0]; err != nil {
		t.Fatal(err)
	}
	select {
	case <-ended:
		t.Fatal("an extended entry was ended")
	case <-time.After(50 * time.Millisecond):
	}
	if g.Lookup("k", "o") != e {
		t.Fatal("an extended entry was dropped")
	}
}
