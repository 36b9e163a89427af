package rediskit

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fenced-dev/fenced/driver"
)

// WaitersSlack is how much longer than the grant a refused try's entry in
// a key's waiter queue (Keys.Waiters) stands. The waiter sleeps at most
// the grant's PTTL (plus a millisecond) on its own clock, which starts
// when the reply arrives. A release just before the waiter's retry must
// still wake it, so the entry must outlive that sleep. An entry that
// outlives its waiters costs one wake-up nobody takes.
const WaitersSlack = time.Second

// WaitQueue is a process's side of the waiter queue of lua/waiter_queue.lua,
// shared by the redis and redlock drivers. While the process has waiters
// for a key it stands in the key's queue (Keys.Waiters, on every node the
// driver writes to) as the member of its current waiting episode for the
// key: from its first waiter's Join to its last waiter's Leave. A release
// takes the member that has stood longest off the queue and publishes on
// that process's own channel (WaitChannel), so each release wakes one
// process, not every process with a waiter.
//
// Each episode has a member of its own (the queue's id and a number), so
// that the end of one episode, which takes its member off the queue, never
// takes off the next one's. It is safe for concurrent use.
type WaitQueue struct {
	id    string
	leave func(ctx context.Context, k Keys, member string)

	mu       sync.Mutex
	closed   bool
	episodes map[string]*Episode // by Keys.Channel
	gen      atomic.Uint64
	leaving  sync.WaitGroup // leave calls in flight
}

// Episode is a process's waiting for one key: its member in the key's
// waiter queue and how many of its waiters have joined.
type Episode struct {
	member string
	n      int
}

// NewWaitQueue returns the waiter queue side of a process whose waiters
// are woken on channels named with id (a Hub's ID, or one id shared by the
// hubs of several nodes). leave runs the end of an episode at the store
// (lua/leave_waiters.lua on each node): it takes member off k's queue and,
// if the key is free, wakes the next process; it runs in the background,
// with a context of its own.
func NewWaitQueue(id string, leave func(ctx context.Context, k Keys, member string)) *WaitQueue {
	return &WaitQueue{id: id, leave: leave, episodes: map[string]*Episode{}}
}

// WaitChannel is the channel on which this process's waiters for k are
// woken: the key's channel and the queue's id.
func (q *WaitQueue) WaitChannel(k Keys) string { return k.Channel + ":" + q.id }

// Join counts a waiter for k in, starting an episode if it is the first.
// Every Join is matched by one Leave of the episode it returned.
func (q *WaitQueue) Join(k Keys) *Episode {
	q.mu.Lock()
	defer q.mu.Unlock()
	ep := q.episodes[k.Channel]
	if ep == nil {
		ep = &Episode{member: q.id + ":" + strconv.FormatUint(q.gen.Add(1), 36)}
		q.episodes[k.Channel] = ep
	}
	ep.n++
	return ep
}

// Current returns how many waiters this process has joined for k and its
// member in k's waiter queue (0 and "" if none): what a try sends so that a
// refusal makes the process stand in the queue.
func (q *WaitQueue) Current(k Keys) (int, string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if ep := q.episodes[k.Channel]; ep != nil {
		return ep.n, ep.member
	}
	return 0, ""
}

// Leave counts a waiter of episode ep out. The last one ends the episode
// and, in the background, calls leave: a wake-up this process took but did
// not use (its waiter gave up) would otherwise be lost to the others. Once
// Close has begun no leave starts; the entries lapse on their own.
func (q *WaitQueue) Leave(k Keys, ep *Episode) {
	q.mu.Lock()
	ep.n--
	last := ep.n == 0 && q.episodes[k.Channel] == ep
	if last {
		delete(q.episodes, k.Channel)
	}
	last = last && !q.closed
	if last {
		q.leaving.Add(1)
	}
	q.mu.Unlock()
	if !last {
		return
	}
	go func() {
		defer q.leaving.Done()
		q.leave(context.Background(), k, ep.member)
	}()
}

// Close stops Leave from starting leave calls and waits for those in
// flight.
func (q *WaitQueue) Close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.leaving.Wait()
}

// Sub wraps a waiter's subscription s to k's wait channel: closing it
// counts the waiter out of episode ep (once).
func (q *WaitQueue) Sub(s driver.Subscription, k Keys, ep *Episode) driver.Subscription {
	return &queuedSub{Subscription: s, q: q, k: k, ep: ep}
}

// queuedSub is a waiter's subscription: closing it counts the waiter out
// of its process's waiting episode.
type queuedSub struct {
	driver.Subscription
	q    *WaitQueue
	k    Keys
	ep   *Episode
	once sync.Once
}

// Close implements driver.Subscription.
func (s *queuedSub) Close() error {
	err := s.Subscription.Close()
	s.once.Do(func() { s.q.Leave(s.k, s.ep) })
	return err
}

// Forward implements driver.WakeForwarder: the wake-up is handed on to the
// next waiter of this process.
func (s *queuedSub) Forward() {
	if f, ok := s.Subscription.(driver.WakeForwarder); ok {
		f.Forward()
	}
}
