package fencedredis

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/backend/rediskit"
)

// observedTTL is how long a key's observer mark (rediskit.Keys.Observed)
// lasts unless refreshed. Each process observing the key refreshes it
// every observedTTL/3, so a mark outlives its last observer by at most
// observedTTL: until then releases of the key publish for nobody.
const observedTTL = 30 * time.Second

// SubscribeObserver implements driver.ObserveNotifier: the observer is
// woken by every message on the key's channel and never takes the wake-up
// of this process's waiters (rediskit.Hub.Observe). It also marks the key
// as observed at the server, so that a release nobody waits for publishes
// too. It returns once both are in place: a release or break after it
// returns wakes the observer.
func (d *Driver) SubscribeObserver(ctx context.Context, key string) (driver.Subscription, error) {
	if err := d.usable(); err != nil {
		return nil, err
	}
	k := d.layout.Keys(key)
	s, err := d.hub.Observe(ctx, k.Channel)
	if err != nil {
		return nil, err
	}
	if err := d.marks.add(ctx, d.c, k.Observed); err != nil {
		s.Close()
		return nil, fmt.Errorf("redis: observe %q: %w", key, rediskit.Classify(err, false))
	}
	return &observation{Subscription: s, done: func() { d.marks.remove(k.Observed) }}, nil
}

// observation is a subscription that drops its key's mark when closed.
type observation struct {
	driver.Subscription
	once sync.Once
	done func()
}

// Close implements driver.Subscription.
func (o *observation) Close() error {
	o.once.Do(o.done)
	return o.Subscription.Close()
}

// observedMarks keeps this process's observer marks: one per observed
// key, however many observers it has, refreshed together in one
// pipeline.
type observedMarks struct {
	mu     sync.Mutex
	count  map[string]int
	stop   chan struct{}
	done   chan struct{}
	closed bool
}

// add sets mark at the server and keeps it refreshed until as many
// removes.
// A mark this process keeps already costs no round trip: refresh sets it.
func (m *observedMarks) add(ctx context.Context, c redis.UniversalClient, mark string) error {
	m.mu.Lock()
	kept := m.count[mark] > 0
	m.mu.Unlock()
	if !kept {
		if err := c.Set(ctx, mark, "1", observedTTL).Err(); err != nil {
			return err
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.count == nil {
		m.count = map[string]int{}
	}
	m.count[mark]++
	if m.stop == nil && !m.closed {
		m.stop, m.done = make(chan struct{}), make(chan struct{})
		go m.refresh(c, m.stop, m.done)
	}
	return nil
}

// remove ends one add of mark. The mark itself expires at the server.
func (m *observedMarks) remove(mark string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.count[mark]--; m.count[mark] <= 0 {
		delete(m.count, mark)
	}
}

// refresh sets every mark again every observedTTL/3 until stop closes.
// Errors are ignored: a mark that lapses costs its observers the release
// wake-ups, and they read the store on their timers meanwhile.
func (m *observedMarks) refresh(c redis.UniversalClient, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(observedTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		m.mu.Lock()
		marks := make([]string, 0, len(m.count))
		for k := range m.count {
			marks = append(marks, k)
		}
		m.mu.Unlock()
		if len(marks) == 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), observedTTL/3)
		_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, k := range marks {
				p.Set(ctx, k, "1", observedTTL)
			}
			return nil
		})
		cancel()
	}
}

// close stops the refreshing and waits for it.
func (m *observedMarks) close() {
	m.mu.Lock()
	stop, done := m.stop, m.done
	m.stop, m.closed = nil, true
	m.mu.Unlock()
	if stop != nil {
		close(stop)
		<-done
	}
}
