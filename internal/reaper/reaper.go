// Package reaper ends the grants of session-based backends (etcd,
// ZooKeeper) that their holder stopped renewing although the session that
// carries them stays alive.
//
// A session outlives each of its grants: other grants, or the client
// library's own pings, keep it alive. A grant whose holder stopped renewing
// (AutoRenew Off, a lost outcome, a waiter that gave up) must still end on
// time, so the driver arms a deadline per grant and deletes the grant's key
// when the deadline passes without being pushed back. The authority's clock
// still decides expiry when the process stalls: then the session lapses.
package reaper

import (
	"sync"
	"time"
)

// Reaper calls end for an item once its deadline passes without being moved.
// If end fails it is tried again every retry until it succeeds, the item is
// forgotten or the Reaper is closed. Items are compared with ==.
type Reaper[T comparable] struct {
	end   func(T) error
	retry time.Duration

	mu     sync.Mutex
	items  map[T]*item
	closed bool
	wg     sync.WaitGroup
}

type item struct {
	deadline time.Time
	timer    *time.Timer // nil while an EndNow runs
}

func (it *item) stop() {
	if it.timer != nil {
		it.timer.Stop()
	}
}

// New returns a Reaper that ends items with end.
func New[T comparable](end func(T) error, retry time.Duration) *Reaper[T] {
	return &Reaper[T]{end: end, retry: retry, items: map[T]*item{}}
}

// Set arms (or moves) x's deadline.
func (r *Reaper[T]) Set(x T, deadline time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	it := r.items[x]
	if it == nil {
		it = &item{}
		r.items[x] = it
	} else {
		it.stop()
	}
	it.deadline = deadline
	it.timer = time.AfterFunc(time.Until(deadline), func() { r.fire(x, it) })
}

// Deadline returns x's deadline, if it is armed.
func (r *Reaper[T]) Deadline(x T) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if it := r.items[x]; it != nil {
		return it.deadline, true
	}
	return time.Time{}, false
}

// Forget disarms x without ending it.
func (r *Reaper[T]) Forget(x T) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if it := r.items[x]; it != nil {
		it.stop()
		delete(r.items, x)
	}
}

// EndNow ends x at once, on the caller's goroutine. If that fails, x stays
// armed and is tried again in the background; the error is returned.
func (r *Reaper[T]) EndNow(x T) error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	it := r.items[x]
	if it == nil {
		it = &item{}
		r.items[x] = it
	} else {
		it.stop()
	}
	it.deadline, it.timer = time.Now(), nil
	r.wg.Add(1)
	r.mu.Unlock()
	defer r.wg.Done()
	return r.run(x, it)
}

// Close disarms everything and waits for ends in progress.
func (r *Reaper[T]) Close() {
	r.mu.Lock()
	r.closed = true
	for x, it := range r.items {
		it.stop()
		delete(r.items, x)
	}
	r.mu.Unlock()
	r.wg.Wait()
}

func (r *Reaper[T]) fire(x T, it *item) {
	r.mu.Lock()
	if r.closed || r.items[x] != it || time.Now().Before(it.deadline) {
		r.mu.Unlock()
		return
	}
	r.wg.Add(1)
	r.mu.Unlock()
	defer r.wg.Done()
	_ = r.run(x, it)
}

// run calls end and, on failure, rearms x for a retry.
func (r *Reaper[T]) run(x T, it *item) error {
	err := r.end(x)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.items[x] != it {
		return err // moved or forgotten meanwhile
	}
	if err == nil {
		it.stop()
		delete(r.items, x)
		return nil
	}
	if !r.closed {
		it.stop()
		it.timer = time.AfterFunc(r.retry, func() { r.fire(x, it) })
	}
	return err
}
