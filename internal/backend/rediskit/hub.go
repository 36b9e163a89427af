package rediskit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/driver/wakeup"
	"github.com/redis/go-redis/v9"
)

// Hub wakes waiters through Redis pub/sub. The release and break scripts
// PUBLISH in the same atomic step that frees the key. The redis backend's
// release publishes only to the process first in the key's waiter queue, on
// that process's own channel (see lua/waiter_queue.lua).
//
// Why pub/sub? A blocking list (BLPOP) needs one blocked connection per
// waiting goroutine. And a token pushed for a waiter that has since given
// up must be cleaned up. Keyspace notifications need server configuration
// (notify-keyspace-events) that managed Redis services often forbid. They
// also fire for every write. Pub/sub needs no configuration and one
// connection per Hub, whatever the number of keys and waiters.
//
// One Hub holds one subscriber connection. It subscribes to a key's channel
// while someone in this process waits for that key. It fans each message
// out to the waiters of that key only: there is no herd across keys. Within
// a key, a release wakes one waiter of this process: the oldest whose wake
// is not already pending (local arrival order). A waiter that leaves with a
// wake unconsumed passes it on. Waiters in other processes are woken by
// their own hubs. So each release wakes at most one waiter per process.
//
// Messages lost while the connection is down are covered by the portable
// layer's fallback timer. After go-redis reconnects and re-subscribes,
// every waiter of a re-subscribed key is woken, since a release may have
// been missed.
type Hub struct {
	client redis.UniversalClient
	id     string

	cmdMu sync.Mutex // orders SUBSCRIBE and UNSUBSCRIBE with the pending queue

	mu      sync.Mutex
	ps      *redis.PubSub
	topics  map[string]*topic
	pending map[string][]chan struct{} // per channel, SUBSCRIBEs awaiting confirmation, in order sent
	wake    wakeup.Registry            // waiters by channel
	closed  bool
	done    chan struct{}
}

type topic struct {
	ready chan struct{} // closed when the server confirmed the subscription
	idle  *time.Timer   // unsubscribes after Linger without subscribers
	gen   int           // identifies the current idle timer
}

// Linger is how long a key's channel stays subscribed after its last waiter
// left. So a process that waits for the same key again and again does not
// pay a SUBSCRIBE round trip each time.
const Linger = 5 * time.Second

// sub is a waiter's subscription: the registry's, closed in order with
// SUBSCRIBE and UNSUBSCRIBE.
type sub struct {
	*wakeup.Sub
	h       *Hub
	channel string
}

// NewHub returns a Hub over c. It connects on first use.
func NewHub(c redis.UniversalClient) *Hub {
	h := &Hub{client: c, id: newHubID(), topics: map[string]*topic{}, pending: map[string][]chan struct{}{}, done: make(chan struct{})}
	h.wake.Idle = h.idle
	h.wake.PassOn = true // one wake-up per release: hand it on
	return h
}

// newHubID returns 16 random hex digits.
func newHubID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// ID identifies the hub (the process, for a backend that has one hub per
// client) among the waiters of a key: random, 16 hex digits.
func (h *Hub) ID() string { return h.id }

// confirmTimeout bounds the wait for a SUBSCRIBE confirmation.
const confirmTimeout = 5 * time.Second

// Subscribe returns a subscription to channel once the server has
// confirmed it, so a release published after Subscribe returns is never
// missed.
func (h *Hub) Subscribe(ctx context.Context, channel string) (driver.Subscription, error) {
	return h.subscribe(ctx, channel, false)
}

// Observe is Subscribe for an observer (driver.ObserveNotifier). It is
// woken by every message on channel. It never takes the one wake-up a
// release gives this process's waiters. It never enters a waiter queue, so
// it never asks a release to publish.
func (h *Hub) Observe(ctx context.Context, channel string) (driver.Subscription, error) {
	return h.subscribe(ctx, channel, true)
}

func (h *Hub) subscribe(ctx context.Context, channel string, observer bool) (driver.Subscription, error) {
	h.cmdMu.Lock()
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		h.cmdMu.Unlock()
		return nil, fenced.ErrClosed
	}
	t := h.topics[channel]
	fresh := t == nil
	if t != nil && t.idle != nil {
		t.idle.Stop()
		t.idle = nil
		t.gen++
	}
	if fresh {
		t = &topic{ready: make(chan struct{})}
		h.topics[channel] = t
		h.pending[channel] = append(h.pending[channel], t.ready)
	}
	s := &sub{h: h, channel: channel}
	if observer {
		s.Sub = h.wake.Observe(channel)
	} else {
		s.Sub = h.wake.Subscribe(channel)
	}
	start := h.ps == nil
	if start {
		h.ps = h.client.Subscribe(context.WithoutCancel(ctx))
	}
	ps := h.ps
	h.mu.Unlock()
	if start {
		go h.read(ps)
	}
	var err error
	if fresh {
		err = ps.Subscribe(ctx, channel)
	}
	h.cmdMu.Unlock()
	if err != nil {
		h.mu.Lock()
		q := h.pending[channel]
		for i, c := range q {
			if c == t.ready {
				h.pending[channel] = append(q[:i:i], q[i+1:]...)
				break
			}
		}
		h.mu.Unlock()
		s.Close()
		return nil, fmt.Errorf("subscribe %s: %w", channel, Classify(err, false))
	}
	timer := time.NewTimer(confirmTimeout)
	defer timer.Stop()
	select {
	case <-t.ready:
		return s, nil
	case <-ctx.Done():
		s.Close()
		return nil, context.Cause(ctx)
	case <-timer.C:
		s.Close()
		return nil, fmt.Errorf("subscribe %s: %w: no confirmation within %v", channel, fenced.ErrUnavailable, confirmTimeout)
	case <-h.done:
		s.Close()
		return nil, fenced.ErrClosed
	}
}

// healthEvery is how long the subscriber connection may stay silent before
// the hub pings it.
const healthEvery = 15 * time.Second

// read receives on the subscriber connection itself (rather than through
// go-redis's Channel, which adds a goroutine hop to every wake-up). go-redis
// reconnects and re-subscribes on the next receive after an error.
func (h *Hub) read(ps *redis.PubSub) {
	ctx := context.Background()
	for {
		m, err := ps.ReceiveTimeout(ctx, healthEvery)
		if err != nil {
			select {
			case <-h.done:
				return
			default:
			}
			if errors.Is(err, redis.ErrClosed) {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				_ = ps.Ping(pctx)
				cancel()
				continue
			}
			select {
			case <-h.done:
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		h.handle(m)
	}
}

func (h *Hub) handle(m any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch m := m.(type) {
	case *redis.Subscription:
		if m.Kind != "subscribe" {
			return
		}
		if q := h.pending[m.Channel]; len(q) > 0 {
			close(q[0])
			if len(q) == 1 {
				delete(h.pending, m.Channel)
			} else {
				h.pending[m.Channel] = q[1:]
			}
		} else if t := h.topics[m.Channel]; t != nil {
			// Re-subscribed after a reconnect: a release may have been
			// missed, so let every waiter check.
			h.wake.Wake(m.Channel)
		}
	case *redis.Message:
		if h.topics[m.Channel] != nil {
			h.wake.WakeOne(m.Channel)
		}
	}
}

// Close implements driver.Subscription. A wake-up this subscriber did not
// consume goes to the next waiter; Linger after the last subscriber of a
// key left, the channel is unsubscribed.
func (s *sub) Close() error {
	s.h.cmdMu.Lock()
	defer s.h.cmdMu.Unlock()
	return s.Sub.Close()
}

// idle arms the idle timer of channel, whose last subscriber left.
func (h *Hub) idle(channel string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	t := h.topics[channel]
	if t == nil {
		return
	}
	t.gen++
	gen := t.gen
	t.idle = time.AfterFunc(Linger, func() { h.unsubscribeIdle(channel, t, gen) })
}

// unsubscribeIdle drops t if it is still idle with timer idle.
func (h *Hub) unsubscribeIdle(channel string, t *topic, gen int) {
	h.cmdMu.Lock()
	defer h.cmdMu.Unlock()
	h.mu.Lock()
	if h.topics[channel] != t || t.gen != gen || t.idle == nil || h.wake.Waiting(channel) || h.wake.Observed(channel) {
		h.mu.Unlock()
		return
	}
	delete(h.topics, channel)
	ps, closed := h.ps, h.closed
	h.mu.Unlock()
	if ps != nil && !closed {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = ps.Unsubscribe(ctx, channel)
		cancel()
	}
}

// Close closes the subscriber connection. Open subscriptions stop
// receiving; their waiters fall back to timers.
func (h *Hub) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil
	}
	h.closed = true
	close(h.done)
	for _, t := range h.topics {
		if t.idle != nil {
			t.idle.Stop()
		}
	}
	if h.ps != nil {
		return h.ps.Close()
	}
	return nil
}
