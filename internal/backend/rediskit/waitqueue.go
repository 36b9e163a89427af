package rediskit

import (
	"context"
	"time"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/backend/waitqueue"
)

// WaitersSlack is how much longer than the grant a refused try's entry in
// a key's waiter queue (Keys.Waiters) stands. The waiter sleeps at most
// the grant's PTTL (plus a millisecond) on its own clock, which starts
// when the reply arrives. A release just before the waiter's retry must
// still wake it, so the entry must outlive that sleep. An entry that
// outlives its waiters costs one wake-up nobody takes.
const WaitersSlack = time.Second

// WaitQueue is a process's side of the waiter queue of
// lua/waiter_queue.lua. The redis and redlock drivers share it (see
// internal/backend/waitqueue). While the process has waiters for a key, it
// stands in the key's queue (Keys.Waiters, on every node the driver writes
// to). It stands there as the member of its current waiting episode for the
// key. A release takes the member that has stood longest off the queue. It
// publishes on that process's own channel (WaitChannel), so each release
// wakes one process, not every process with a waiter. A process whose
// channel no client listens on any more (it died) is passed over in the
// same script. A grant to a process with waiters moves it to the end of the
// queue in the grant script itself. It is safe for concurrent use.
type WaitQueue struct {
	q *waitqueue.Queue[Keys]
}

// Episode is a process's waiting for one key (see waitqueue.Episode).
type Episode = waitqueue.Episode

// NewWaitQueue returns the waiter queue side of a process whose waiters are
// woken on channels named with id. The id is a Hub's ID, or one id shared
// by the hubs of several nodes. leave runs the end of an episode at the
// store (lua/leave_waiters.lua on each node). It takes member off k's queue
// and, if the key is free, wakes the next process. It runs in the
// background, with a context of its own.
func NewWaitQueue(id string, leave func(ctx context.Context, k Keys, member string)) *WaitQueue {
	return &WaitQueue{q: waitqueue.New(id, waitqueue.Hooks[Keys]{Leave: leave})}
}

// WaitChannel is the channel on which this process's waiters for k are
// woken: the key's channel and the queue's id.
func (q *WaitQueue) WaitChannel(k Keys) string { return k.Channel + ":" + q.q.ID() }

// Join counts a waiter for k in, starting an episode if it is the first.
// Every Join is matched by one Leave of the episode it returned.
func (q *WaitQueue) Join(k Keys) *Episode { return q.q.Join(k.Channel) }

// Current returns how many waiters this process has joined for k, and its
// member in k's waiter queue (0 and "" if none). A try sends them so that a
// refusal makes the process stand in the queue.
func (q *WaitQueue) Current(k Keys) (int, string) { return q.q.Current(k.Channel) }

// Leave counts a waiter of episode ep out; the last one ends the episode
// at the store, in the background. Once Close has begun no leave starts;
// the entries lapse on their own.
func (q *WaitQueue) Leave(k Keys, ep *Episode) { q.q.Leave(k.Channel, k, ep) }

// Close stops Leave from starting leave calls and waits for those in
// flight.
func (q *WaitQueue) Close() { q.q.Close() }

// Sub wraps a waiter's subscription s to k's wait channel: closing it
// counts the waiter out of episode ep (once).
func (q *WaitQueue) Sub(s driver.Subscription, k Keys, ep *Episode) driver.Subscription {
	return q.q.Sub(s, k.Channel, k, ep)
}
