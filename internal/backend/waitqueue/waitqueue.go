// Package waitqueue is a process's side of a store-kept queue of waiting
// processes, one queue per key: the Redis, Redlock and SQLite backends stand
// a process in a key's queue while it has waiters for the key, and a
// release wakes only the process that has stood longest. Each release then
// wakes one process, not every process with a waiter.
//
// A process's waiting for one key is an episode: from its first waiter's
// Join to its last waiter's Leave. Each episode has a member of its own (the
// process's id and a number), so that the end of one episode, which takes
// its member off the queue in the background, never takes off the member of
// the episode that follows it.
package waitqueue

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/fenced-dev/fenced/driver"
)

// Hooks are the store's side of a queue. K is the backend's description
// of a key (its name, or the names of its store keys).
type Hooks[K any] struct {
	// Leave ends an episode at the store: it takes member off k's queue
	// and, if the key is free, wakes the next process. It runs in the
	// background with a context of its own, after the episode's last
	// waiter left: a wake-up this process took but did not use (its
	// waiter gave up) would otherwise be lost to the others.
	Leave func(ctx context.Context, k K, member string)
	// Requeue, if set, moves member to the end of k's queue. It runs in
	// the background when a waiter leaves and others of its episode stay
	// (the waiter was granted the key, or gave up), so that a process with
	// many waiters takes its turn with the others instead of keeping the
	// head of the queue. Nil where the store does it itself, as part of
	// the grant.
	Requeue func(ctx context.Context, k K, member string)
}

// Queue is a process's episodes, by key. It is safe for concurrent use.
type Queue[K any] struct {
	id    string
	hooks Hooks[K]

	mu       sync.Mutex
	closed   bool
	episodes map[string]*Episode // by the key's name
	gen      atomic.Uint64
	inFlight sync.WaitGroup // hook calls running
}

// Episode is a process's waiting for one key: its member in the key's
// queue and how many of its waiters have joined.
type Episode struct {
	member string
	n      int
}

// Member is the episode's member in the key's queue: the queue's id, a
// colon, and a number.
func (e *Episode) Member() string { return e.member }

// New returns the queue side of the process whose members start with id
// (followed by a colon and a number).
func New[K any](id string, hooks Hooks[K]) *Queue[K] {
	return &Queue[K]{id: id, hooks: hooks, episodes: map[string]*Episode{}}
}

// ID is the id the queue's members start with.
func (q *Queue[K]) ID() string { return q.id }

// Join counts a waiter for the key named name in, starting an episode if
// it is the first. Every Join is matched by one Leave of the episode it
// returned.
func (q *Queue[K]) Join(name string) *Episode {
	q.mu.Lock()
	defer q.mu.Unlock()
	ep := q.episodes[name]
	if ep == nil {
		ep = &Episode{member: q.id + ":" + strconv.FormatUint(q.gen.Add(1), 36)}
		q.episodes[name] = ep
	}
	ep.n++
	return ep
}

// Current returns how many waiters this process has joined for the key
// named name. It also returns its member in the key's queue (0 and "" if
// none).
func (q *Queue[K]) Current(name string) (int, string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if ep := q.episodes[name]; ep != nil {
		return ep.n, ep.member
	}
	return 0, ""
}

// Leave counts a waiter of episode ep out. The last one ends the episode
// and calls Hooks.Leave in the background; another one calls
// Hooks.Requeue, if set. Once Close has begun no hook starts.
func (q *Queue[K]) Leave(name string, k K, ep *Episode) {
	q.mu.Lock()
	ep.n--
	current := q.episodes[name] == ep
	last := ep.n == 0 && current
	if last {
		delete(q.episodes, name)
	}
	hook := q.hooks.Requeue
	if last {
		hook = q.hooks.Leave
	}
	run := hook != nil && current && !q.closed
	if run {
		q.inFlight.Add(1)
	}
	q.mu.Unlock()
	if !run {
		return
	}
	go func() {
		defer q.inFlight.Done()
		hook(context.Background(), k, ep.member)
	}()
}

// Close stops Leave from starting hooks, and waits for those running.
func (q *Queue[K]) Close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.inFlight.Wait()
}

// Sub wraps a waiter's subscription s to the key named name: closing it
// counts the waiter out of episode ep (once).
func (q *Queue[K]) Sub(s driver.Subscription, name string, k K, ep *Episode) driver.Subscription {
	return &queuedSub{Subscription: s, leave: func() { q.Leave(name, k, ep) }}
}

// queuedSub is a waiter's subscription: closing it counts the waiter out
// of its process's episode.
type queuedSub struct {
	driver.Subscription
	leave func()
	once  sync.Once
}

// Close implements driver.Subscription.
func (s *queuedSub) Close() error {
	err := s.Subscription.Close()
	s.once.Do(s.leave)
	return err
}

// Forward implements driver.WakeForwarder: the wake-up is handed on to the
// next waiter of this process.
func (s *queuedSub) Forward() {
	if f, ok := s.Subscription.(driver.WakeForwarder); ok {
		f.Forward()
	}
}
