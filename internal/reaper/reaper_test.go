package reaper

import (
	"errors"
	"sync"
	"testing"
	"time"
)

type recorder struct {
	mu    sync.Mutex
	ended map[string]int
	fail  map[string]int // failures left per item
}

func (r *recorder) end(x string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail[x] > 0 {
		r.fail[x]--
		return errors.New("unreachable")
	}
	r.ended[x]++
	return nil
}

func (r *recorder) count(x string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ended[x]
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestReaper(t *testing.T) {
	rec := &recorder{ended: map[string]int{}, fail: map[string]int{"flaky": 2}}
	r := New(rec.end, 20*time.Millisecond)
	defer r.Close()
	now := time.Now()

	r.Set("due", now.Add(30*time.Millisecond))
	r.Set("moved", now.Add(30*time.Millisecond))
	r.Set("moved", now.Add(time.Hour)) // a renewal pushes it back
	r.Set("forgotten", now.Add(30*time.Millisecond))
	r.Forget("forgotten") // released normally
	r.Set("flaky", now)
	waitFor(t, "the due item to end", func() bool { return rec.count("due") == 1 })
	waitFor(t, "the flaky item to end after two failures", func() bool { return rec.count("flaky") == 1 })
	time.Sleep(100 * time.Millisecond)
	if rec.count("moved") != 0 || rec.count("forgotten") != 0 {
		t.Fatalf("ended a moved or forgotten item: %v", rec.ended)
	}
	if rec.count("due") != 1 || rec.count("flaky") != 1 {
		t.Fatalf("items ended more than once: %v", rec.ended)
	}
	if dl, ok := r.Deadline("moved"); !ok || dl.Before(now.Add(59*time.Minute)) {
		t.Fatalf("Deadline(moved) = %v, %v", dl, ok)
	}
	if _, ok := r.Deadline("due"); ok {
		t.Fatal("an ended item is still armed")
	}

	// EndNow ends at once; a failure is retried in the background.
	rec.fail["now"] = 1
	if err := r.EndNow("now"); err == nil {
		t.Fatal("EndNow hid the failure")
	}
	waitFor(t, "the retried EndNow", func() bool { return rec.count("now") == 1 })
	if err := r.EndNow("again"); err != nil || rec.count("again") != 1 {
		t.Fatalf("EndNow = %v, ended %d times", err, rec.count("again"))
	}
}

func TestCloseDisarms(t *testing.T) {
	rec := &recorder{ended: map[string]int{}, fail: map[string]int{}}
	r := New(rec.end, 10*time.Millisecond)
	r.Set("x", time.Now().Add(20*time.Millisecond))
	r.Close()
	time.Sleep(60 * time.Millisecond)
	if rec.count("x") != 0 {
		t.Fatal("an item ended after Close")
	}
}

// TestManyItems arms a thousand items on the one timer, in shuffled
// deadline order, moves some far ahead and forgets others: exactly the
// rest end, each once, and none before its deadline.
func TestManyItems(t *testing.T) {
	var mu sync.Mutex
	early := 0
	ended := map[int]int{}
	var deadlines sync.Map
	r := New(func(x int) error {
		d, _ := deadlines.Load(x)
		mu.Lock()
		defer mu.Unlock()
		if time.Now().Before(d.(time.Time)) {
			early++
		}
		ended[x]++
		return nil
	}, 10*time.Millisecond)
	defer r.Close()
	const n = 1000
	now := time.Now().Add(200 * time.Millisecond) // time to move and forget some first
	for i := range n {
		d := now.Add(time.Duration((i*7919)%n) * 200 * time.Microsecond)
		deadlines.Store(i, d)
		r.Set(i, d)
	}
	for i := 0; i < n; i += 10 {
		r.Set(i, now.Add(time.Hour)) // renewed
	}
	for i := 5; i < n; i += 10 {
		r.Forget(i) // released
	}
	want := n - n/10 - n/10
	waitFor(t, "every due item to end", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(ended) == want
	})
	time.Sleep(50 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	for i := range n {
		wantEnds := 1
		if i%10 == 0 || i%10 == 5 {
			wantEnds = 0
		}
		if ended[i] != wantEnds {
			t.Errorf("item %d ended %d times, want %d", i, ended[i], wantEnds)
		}
	}
	if early > 0 {
		t.Errorf("%d items ended before their deadline", early)
	}
}
