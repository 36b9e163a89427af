package sessionlock

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
	r := newReaper(rec.end, 20*time.Millisecond)
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
	r := newReaper(rec.end, 10*time.Millisecond)
	r.Set("x", time.Now().Add(20*time.Millisecond))
	r.Close()
	time.Sleep(60 * time.Millisecond)
	if rec.count("x") != 0 {
		t.Fatal("an item ended after Close")
	}
}

// TestManyItems arms a thousand items on the one timer, in shuffled
// deadline order, moves some far ahead and forgets others: exactly the
// rest end, each once, and none before its deadline. The first deadline
// leaves the moves and forgets time to happen first: 200ms, doubled (up
// to four times) when the machine took longer for them (hog7).
func TestManyItems(t *testing.T) {
	for window := 200 * time.Millisecond; ; window *= 2 {
		took, ok := manyItems(t, window)
		if ok {
			return
		}
		if window >= 1600*time.Millisecond {
			t.Fatalf("arming, moving and forgetting 1000 items took %v, past the first deadline %v", took, window)
		}
		t.Logf("arming, moving and forgetting 1000 items took %v, past the first deadline %v: again", took, window)
	}
}

// manyItems runs TestManyItems once with its first deadline window from
// now. ok is false, and nothing checked, if the set-up took longer.
func manyItems(t *testing.T, window time.Duration) (took time.Duration, ok bool) {
	t.Helper()
	var mu sync.Mutex
	early := 0
	ended := map[int]int{}
	var deadlines sync.Map
	r := newReaper(func(x int) error {
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
	began := time.Now()
	now := began.Add(window) // time to move and forget some first
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
	if took = time.Since(began); took >= window {
		return took, false
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
	return took, true
}

// TestBatches: items due together are ended in batches of up to the
// batch size, all of them once; an item whose end failed in a batch is
// tried again on its own schedule while the others stay ended.
func TestBatches(t *testing.T) {
	var mu sync.Mutex
	ended := map[int]int{}
	var sizes []int
	failsLeft := map[int]int{7: 2}
	r := newReaperBatched(func(xs []int) []error {
		mu.Lock()
		defer mu.Unlock()
		sizes = append(sizes, len(xs))
		errs := make([]error, len(xs))
		for i, x := range xs {
			if failsLeft[x] > 0 {
				failsLeft[x]--
				errs[i] = errors.New("unreachable")
				continue
			}
			ended[x]++
		}
		return errs
	}, 32, 10*time.Millisecond)
	defer r.Close()
	const n = 1000
	due := time.Now().Add(50 * time.Millisecond)
	for i := range n {
		r.Set(i, due)
	}
	waitFor(t, "every item to end", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(ended) == n
	})
	time.Sleep(50 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	for i := range n {
		if ended[i] != 1 {
			t.Fatalf("item %d ended %d times, want once", i, ended[i])
		}
	}
	calls, largest := len(sizes), 0
	for _, s := range sizes {
		if s > 32 {
			t.Fatalf("a batch of %d items, more than 32", s)
		}
		largest = max(largest, s)
	}
	// 1000 items due at once need at least 32 calls; the retries of item 7
	// add two. Far fewer than one call per item.
	if calls > n/4 || largest < 16 {
		t.Fatalf("%d calls (largest batch %d) for %d items due together, want batches", calls, largest, n)
	}
}
