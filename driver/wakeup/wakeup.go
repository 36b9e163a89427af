// Package wakeup is a registry of per-key waiters for drivers that
// implement driver.Notifier: a waiter subscribes to a key, the driver
// wakes the subscribers of a key when it learns that the key was freed
// (from its own release, a LISTEN notification, a pub/sub message, a
// change counter), and a subscriber that leaves never blocks the driver.
//
// A wake-up is a token in a one-slot channel: waking a subscriber that
// already has one pending does nothing, so a burst of releases costs a
// waiter one look at the store. A wake-up is a hint, never a grant: the
// waiter still asks the store.
//
// The mem, sqlite, postgres, redis and redlock backends use it; a
// third-party backend with any notification source can use it too.
package wakeup

import "sync"

// Registry holds the subscribers of each key, in the order they
// subscribed. The zero value is ready to use. It is safe for concurrent
// use.
type Registry struct {
	// Idle, if set, is called after the last subscriber of key left
	// (outside the registry's lock), so the driver can stop listening.
	Idle func(key string)
	// PassOn makes a subscriber that closes with a wake-up it did not
	// consume hand it to the next subscriber of the key without one
	// pending. Set it when the driver wakes one waiter per release
	// (WakeOne), so a release is not lost when its waiter leaves; a driver
	// that wakes every waiter (Wake) leaves it off, since the others were
	// woken already and a second wake-up would only add a look at the
	// store.
	PassOn bool

	mu   sync.Mutex
	subs map[string][]*Sub
}

// Sub is one waiter's subscription to a key. It implements
// driver.Subscription.
type Sub struct {
	r    *Registry
	key  string
	c    chan struct{}
	once sync.Once
}

// Subscribe adds a subscriber to key.
func (r *Registry) Subscribe(key string) *Sub {
	s := &Sub{r: r, key: key, c: make(chan struct{}, 1)}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.subs == nil {
		r.subs = map[string][]*Sub{}
	}
	r.subs[key] = append(r.subs[key], s)
	return s
}

// Wake wakes every subscriber of key.
func (r *Registry) Wake(key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.subs[key] {
		s.wake()
	}
}

// WakeOne wakes the oldest subscriber of key that has no wake-up pending
// (one release, one waiter: no herd within the key). It reports whether
// it woke one.
func (r *Registry) WakeOne(key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.wakeOneLocked(key, nil)
}

func (r *Registry) wakeOneLocked(key string, skip *Sub) bool {
	for _, s := range r.subs[key] {
		if s != skip && s.wake() {
			return true
		}
	}
	return false
}

// WakeEvery wakes every subscriber of every key: after the notification
// source was down, when releases may have been missed.
func (r *Registry) WakeEvery() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, subs := range r.subs {
		for _, s := range subs {
			s.wake()
		}
	}
}

// Keys returns the keys that have subscribers, in no particular order.
func (r *Registry) Keys() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	keys := make([]string, 0, len(r.subs))
	for k := range r.subs {
		keys = append(keys, k)
	}
	return keys
}

// Len returns the number of keys that have subscribers.
func (r *Registry) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.subs)
}

// Waiting reports whether key has subscribers.
func (r *Registry) Waiting(key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.subs[key]) > 0
}

// wake delivers a wake-up; it reports false if one was already pending.
func (s *Sub) wake() bool {
	select {
	case s.c <- struct{}{}:
		return true
	default:
		return false
	}
}

// Forward implements driver.WakeForwarder: with PassOn, it wakes the next
// subscriber of the key without a wake-up pending (never s itself), to
// take over a wake-up that s consumed and will not act on. Without PassOn
// every subscriber was woken already, and Forward does nothing.
func (s *Sub) Forward() {
	r := s.r
	if !r.PassOn {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.wakeOneLocked(s.key, s)
}

// Key returns the key s waits for.
func (s *Sub) Key() string { return s.key }

// C implements driver.Subscription: it receives a value when the key may
// have been freed.
func (s *Sub) C() <-chan struct{} { return s.c }

// Close implements driver.Subscription. With PassOn, a wake-up s received
// but did not consume goes to the next subscriber of the key without one
// pending. Close is idempotent and never fails.
func (s *Sub) Close() error {
	s.once.Do(func() {
		r := s.r
		r.mu.Lock()
		subs := r.subs[s.key]
		for i, x := range subs {
			if x == s {
				subs = append(subs[:i:i], subs[i+1:]...)
				break
			}
		}
		if r.PassOn {
			select {
			case <-s.c:
				r.wakeOneLocked(s.key, s)
			default:
			}
		}
		last := len(subs) == 0
		if last {
			delete(r.subs, s.key)
		} else {
			r.subs[s.key] = subs
		}
		r.mu.Unlock()
		if last && r.Idle != nil {
			r.Idle(s.key)
		}
	})
	return nil
}
