// The reaper ends the grants of session-based backends (etcd, ZooKeeper)
// that their holder stopped renewing although the session that carries
// them stays alive.
//
// A session outlives each of its grants: other grants, or the client
// library's own pings, keep it alive. A grant whose holder stopped renewing
// (ManualRenew, a lost outcome, a waiter that gave up) must still end on
// time, so the driver arms a deadline per grant and deletes the grant's key
// when the deadline passes without being pushed back. The authority's clock
// still decides expiry when the process stalls: then the session lapses.

package sessionlock

import (
	"container/heap"
	"slices"
	"sync"
	"time"
)

// reaper calls end for an item once its deadline passes without being moved.
// If end fails it is tried again every retry until it succeeds, the item is
// forgotten or the reaper is closed. Items are compared with ==. A reaper
// made by newReaperBatched ends the items due together in batches, one call per
// batch.
//
// All deadlines share one timer, set for the earliest (a min-heap keeps
// them in order), so an armed item costs a map entry and a heap slot, not
// a runtime timer: a driver holding a hundred thousand grants arms as many.
type reaper[T comparable] struct {
	end   func([]T) []error
	batch int // the most items one call of end takes
	retry time.Duration

	mu     sync.Mutex
	items  map[T]*item[T]
	queue  queue[T]    // the armed items, earliest deadline first
	timer  *time.Timer // set for queue's earliest deadline; nil before the first
	armed  time.Time   // what timer is set for (zero: not set)
	closed bool
	wg     sync.WaitGroup
	// due are the items whose deadline passed, waiting for one of at most
	// maxEnders goroutines (enders counts them) to end them.
	due    []*item[T]
	enders int
}

// maxEnders bounds the goroutines that end items at once: a store that
// stopped answering holds up that many, not one per grant (a driver may
// hold a hundred thousand, all due together).
const maxEnders = 16

type item[T comparable] struct {
	x        T
	deadline time.Time
	idx      int // in the queue; -1 while not in it (an end in progress)
}

// New returns a reaper that ends items with end, one at a time.
func newReaper[T comparable](end func(T) error, retry time.Duration) *reaper[T] {
	return newReaperBatched(func(xs []T) []error { return []error{end(xs[0])} }, 1, retry)
}

// NewBatched returns a reaper that ends the items due together in batches
// of up to batch items: end gets the batch and returns one error per item
// (nil: that item ended). After an outage of the store a driver may find
// many thousands of grants due at once, and each end then waits for the
// store; a batch per request drains them that many times faster.
func newReaperBatched[T comparable](end func([]T) []error, batch int, retry time.Duration) *reaper[T] {
	return &reaper[T]{end: end, batch: max(batch, 1), retry: retry, items: map[T]*item[T]{}}
}

// Set arms (or moves) x's deadline.
func (r *reaper[T]) Set(x T, deadline time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	it := r.items[x]
	if it == nil {
		it = &item[T]{x: x, idx: -1}
		r.items[x] = it
	}
	r.armLocked(it, deadline)
}

// armLocked puts it in the queue at deadline (moving it if it is there).
func (r *reaper[T]) armLocked(it *item[T], deadline time.Time) {
	it.deadline = deadline
	if it.idx >= 0 {
		heap.Fix(&r.queue, it.idx)
	} else {
		heap.Push(&r.queue, it)
	}
	r.resetLocked()
}

// resetLocked sets the timer for the queue's earliest deadline, unless it
// is set for that moment already.
func (r *reaper[T]) resetLocked() {
	if len(r.queue) == 0 || r.closed {
		return
	}
	next := r.queue[0].deadline
	if !r.armed.IsZero() && r.armed.Equal(next) {
		return
	}
	r.armed = next
	if r.timer == nil {
		r.timer = time.AfterFunc(time.Until(next), r.fire)
		return
	}
	r.timer.Reset(time.Until(next))
}

// Deadline returns x's deadline, if it is armed.
func (r *reaper[T]) Deadline(x T) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if it := r.items[x]; it != nil {
		return it.deadline, true
	}
	return time.Time{}, false
}

// Forget disarms x without ending it.
func (r *reaper[T]) Forget(x T) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if it := r.items[x]; it != nil {
		if it.idx >= 0 {
			heap.Remove(&r.queue, it.idx)
		}
		delete(r.items, x)
	}
}

// EndNow ends x at once, on the caller's goroutine. If that fails, x stays
// armed and is tried again in the background; the error is returned.
func (r *reaper[T]) EndNow(x T) error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	it := r.items[x]
	if it == nil {
		it = &item[T]{x: x, idx: -1}
		r.items[x] = it
	} else if it.idx >= 0 {
		heap.Remove(&r.queue, it.idx)
	}
	it.deadline = time.Now()
	r.wg.Add(1)
	r.mu.Unlock()
	defer r.wg.Done()
	return r.run([]*item[T]{it})[0]
}

// Close disarms everything and waits for ends in progress.
func (r *reaper[T]) Close() {
	r.mu.Lock()
	r.closed = true
	if r.timer != nil {
		r.timer.Stop()
	}
	clear(r.items)
	for _, it := range r.queue {
		it.idx = -1
	}
	r.queue = nil
	r.due = nil
	r.mu.Unlock()
	r.wg.Wait()
}

// fire hands every item whose deadline has passed to the enders (see
// maxEnders) and sets the timer for the next deadline.
func (r *reaper[T]) fire() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.armed = time.Time{}
	if r.closed {
		return
	}
	now := time.Now()
	for len(r.queue) > 0 && !r.queue[0].deadline.After(now) {
		r.due = append(r.due, heap.Pop(&r.queue).(*item[T]))
	}
	for r.enders < min((len(r.due)+r.batch-1)/r.batch, maxEnders) {
		r.enders++
		r.wg.Add(1)
		go r.ender()
	}
	r.resetLocked()
}

// ender ends due items, a batch at a time, until there are none (or the
// reaper is closed).
func (r *reaper[T]) ender() {
	defer r.wg.Done()
	for {
		r.mu.Lock()
		if len(r.due) == 0 || r.closed {
			r.enders--
			r.mu.Unlock()
			return
		}
		// An item moved and due again may be in the queue twice: a batch
		// takes it once.
		n := min(len(r.due), r.batch)
		its := make([]*item[T], 0, n)
		for _, it := range r.due[:n] {
			if !slices.Contains(its, it) {
				its = append(its, it)
			}
		}
		clear(r.due[:n])
		r.due = r.due[n:]
		r.mu.Unlock()
		r.run(its)
	}
}

// run calls end for its, which are out of the queue, and arms each that
// failed again for a retry. It returns the errors end returned.
func (r *reaper[T]) run(its []*item[T]) []error {
	xs := make([]T, len(its))
	for i, it := range its {
		xs[i] = it.x
	}
	errs := r.end(xs)
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, it := range its {
		if r.items[it.x] != it || it.idx >= 0 {
			continue // forgotten, or armed again (Set) meanwhile
		}
		if errs[i] == nil {
			delete(r.items, it.x)
			continue
		}
		if !r.closed {
			r.armLocked(it, time.Now().Add(r.retry))
		}
	}
	return errs
}

// queue is a min-heap of items by deadline (container/heap).
type queue[T comparable] []*item[T]

func (q queue[T]) Len() int           { return len(q) }
func (q queue[T]) Less(i, j int) bool { return q[i].deadline.Before(q[j].deadline) }
func (q queue[T]) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].idx, q[j].idx = i, j
}

func (q *queue[T]) Push(x any) {
	it := x.(*item[T])
	it.idx = len(*q)
	*q = append(*q, it)
}

func (q *queue[T]) Pop() any {
	old := *q
	it := old[len(old)-1]
	old[len(old)-1] = nil
	it.idx = -1
	*q = old[:len(old)-1]
	return it
}
