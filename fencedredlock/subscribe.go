package fencedredlock

// Release notification: one subscription per node, merged.

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/backend/rediskit"
	"github.com/redis/go-redis/v9"
)

// Subscribe implements driver.Notifier: it subscribes on the nodes,
// returns once a majority confirmed, and merges the wake-ups. A waiter
// listens on its process's own channel for the key. A node's release wakes
// the process first in that node's waiter queue (at most one process per
// node), not every process with a waiter (see rediskit.WaitQueue). The
// process stands in the queues from its first waiter's Subscribe to its
// last waiter's Close, under one member on every node.
func (d *Driver) Subscribe(ctx context.Context, key string) (driver.Subscription, error) {
	if err := d.usable(); err != nil {
		return nil, err
	}
	k := d.layout.Keys(key)
	ep := d.waiters.Join(k)
	s, err := d.subscribe(ctx, key, d.waiters.WaitChannel(k), false)
	if err != nil {
		d.waiters.Leave(k, ep)
		return nil, err
	}
	return d.waiters.Sub(s, k, ep), nil
}

// leaveWaiters ends this process's waiting episode for k on every node
// (see rediskit.WaitQueue.Leave), each within the budget.
func (d *Driver) leaveWaiters(ctx context.Context, k rediskit.Keys, member string) {
	var wg sync.WaitGroup
	for _, n := range d.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(ctx, 4*d.opts.Budget)
			defer cancel()
			_ = rediskit.LeaveWaiters.Run(ctx, n.c, []string{k.Lock, k.Waiters}, member, k.Channel).Err()
		}()
	}
	wg.Wait()
}

// SubscribeObserver implements driver.ObserveNotifier: as Subscribe, with
// each node's subscription an observer's (rediskit.Hub.Observe), so it
// never takes a waiter's wake-up.
func (d *Driver) SubscribeObserver(ctx context.Context, key string) (driver.Subscription, error) {
	if err := d.usable(); err != nil {
		return nil, err
	}
	return d.subscribe(ctx, key, d.layout.Keys(key).Channel, true)
}

// subscribe subscribes to channel ch on the nodes, as a waiter or as an
// observer, and merges the wake-ups.
func (d *Driver) subscribe(ctx context.Context, key, ch string, observer bool) (driver.Subscription, error) {
	sctx, cancel := context.WithTimeout(ctx, d.opts.Budget*4)
	defer cancel()
	rs := fanout(sctx, d, d.opts.Budget*4, func(ctx context.Context, c redis.UniversalClient) (driver.Subscription, error) {
		for _, n := range d.nodes {
			if n.c == c {
				if observer {
					return n.hub.Observe(ctx, ch)
				}
				return n.hub.Subscribe(ctx, ch)
			}
		}
		return nil, errors.New("unknown node")
	}, func(rs []reply[driver.Subscription]) bool {
		// A majority suffices: every grant is on a majority of nodes, so
		// its release publishes on at least one of them; a stopped node
		// must not delay the wait.
		ok := 0
		for _, r := range rs {
			if r.err == nil {
				ok++
			}
		}
		return ok >= d.quorum
	}, func(r reply[driver.Subscription]) {
		if r.err == nil {
			r.val.Close()
		}
	})
	m := &merged{c: make(chan struct{}, 1), done: make(chan struct{})}
	var errs []error
	for _, r := range rs {
		if r.err != nil {
			errs = append(errs, r.err)
			continue
		}
		m.subs = append(m.subs, r.val)
	}
	if len(m.subs) == 0 {
		return nil, fmt.Errorf("redlock: subscribe %q: %w", key, errors.Join(errs...))
	}
	for _, s := range m.subs {
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			for {
				select {
				case <-s.C():
					select {
					case m.c <- struct{}{}:
					default:
					}
				case <-m.done:
					return
				}
			}
		}()
	}
	return m, nil
}

type merged struct {
	c    chan struct{}
	subs []driver.Subscription
	done chan struct{}
	once sync.Once
	wg   sync.WaitGroup
}

func (m *merged) C() <-chan struct{} { return m.c }

// Forward implements driver.WakeForwarder. The wake-up a waiter took from m
// may have come from any node, since they are coalesced. So every node's
// subscription hands one on. A waiter that gave up strands nobody. An extra
// wake-up only costs the woken waiter one look at the nodes.
func (m *merged) Forward() {
	for _, s := range m.subs {
		if f, ok := s.(driver.WakeForwarder); ok {
			f.Forward()
		}
	}
}

func (m *merged) Close() error {
	m.once.Do(func() {
		close(m.done)
		m.wg.Wait()
		for _, s := range m.subs {
			s.Close()
		}
	})
	return nil
}
