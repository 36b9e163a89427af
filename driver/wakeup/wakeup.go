// Package wakeup is a registry of per-key waiters for drivers that implement
// driver.Notifier. A waiter subscribes to a key. The driver wakes the
// subscribers of a key when it learns that the key was freed: from its own
// release, a LISTEN notification, a pub/sub message, or a change counter. A
// subscriber that leaves never blocks the driver.
//
// A wake-up is a token in a one-slot channel: waking a subscriber that
// already has one pending does nothing, so a burst of releases costs a
// waiter one look at the store. A wake-up is a hint, never a grant: the
// waiter still asks the store.
//
// An observer (Observe) is woken by every wake-up of its key and never
// takes one meant for a waiter: a driver that wakes one waiter per release
// (WakeOne) still wakes that waiter, plus every observer. An election
// observer that took the single wake-up of a release, and never acted on
// it, left the candidates to their fallback timers (1 s handovers instead
// of 20 ms on PostgreSQL).
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
	// (waiter or observer; outside the registry's lock), so the driver can
	// stop listening.
	Idle func(key string)
	// PassOn makes a subscriber that closes with a wake-up it did not
	// consume hand it to the next subscriber of the key without one pending.
	// Set it when the driver wakes one waiter per release (WakeOne), so a
	// release is not lost when its waiter leaves. A driver that wakes every
	// waiter (Wake) leaves it off. The others were woken already, and a
	// second wake-up would only add a look at the store.
	PassOn bool

	mu   sync.Mutex
	subs map[string][]*Sub // waiters
	obs  map[string][]*Sub // observers
}

// Sub is one waiter's subscription to a key. It implements
// driver.Subscription.
type Sub struct {
	r        *Registry
	key      string
	observer bool
	c        chan struct{}
	once     sync.Once
}

// Subscribe adds a waiter to key.
func (r *Registry) Subscribe(key string) *Sub {
	return r.add(key, false)
}

// Observe adds an observer to key. It is woken by every wake-up of key
// (Wake, WakeOne, WakeEvery, WakeObservers) and never counts as a waiter
// (Waiting, WakeOne's choice, PassOn).
func (r *Registry) Observe(key string) *Sub {
	return r.add(key, true)
}

func (r *Registry) add(key string, observer bool) *Sub {
	s := &Sub{r: r, key: key, observer: observer, c: make(chan struct{}, 1)}
	r.mu.Lock()
	defer r.mu.Unlock()
	m := &r.subs
	if observer {
		m = &r.obs
	}
	if *m == nil {
		*m = map[string][]*Sub{}
	}
	(*m)[key] = append((*m)[key], s)
	return s
}

// Wake wakes every waiter and observer of key.
func (r *Registry) Wake(key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.subs[key] {
		s.wake()
	}
	r.wakeObserversLocked(key)
}

// WakeOne wakes the oldest waiter of key that has no wake-up pending
// (one release, one waiter: no herd within the key). It also wakes
// every observer of key. It reports whether it woke a waiter.
func (r *Registry) WakeOne(key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.wakeObserversLocked(key)
	return r.wakeOneLocked(key, nil)
}

// WakeObservers wakes the observers of key only. It is for a
// notification that a driver heard for its observers while another
// path serves the key's waiters.
func (r *Registry) WakeObservers(key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.wakeObserversLocked(key)
}

func (r *Registry) wakeObserversLocked(key string) {
	for _, s := range r.obs[key] {
		s.wake()
	}
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
	for _, m := range []map[string][]*Sub{r.subs, r.obs} {
		for _, subs := range m {
			for _, s := range subs {
				s.wake()
			}
		}
	}
}

// Keys returns the keys that have waiters or observers, in no particular
// order.
func (r *Registry) Keys() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	keys := make([]string, 0, len(r.subs)+len(r.obs))
	for k := range r.subs {
		keys = append(keys, k)
	}
	for k := range r.obs {
		if _, dup := r.subs[k]; !dup {
			keys = append(keys, k)
		}
	}
	return keys
}

// Len returns the number of keys that have waiters or observers.
func (r *Registry) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(r.subs)
	for k := range r.obs {
		if _, dup := r.subs[k]; !dup {
			n++
		}
	}
	return n
}

// Waiting reports whether key has waiters (observers do not count).
func (r *Registry) Waiting(key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.subs[key]) > 0
}

// Observed reports whether key has observers.
func (r *Registry) Observed(key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.obs[key]) > 0
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

// Forward implements driver.WakeForwarder. With PassOn, it wakes the next
// subscriber of the key without a wake-up pending (never s itself). It
// takes over a wake-up that s consumed and will not act on. Without
// PassOn every subscriber was woken already, and Forward does nothing. An
// observer's wake-ups were never a waiter's, so its Forward does nothing
// either.
func (s *Sub) Forward() {
	r := s.r
	if !r.PassOn || s.observer {
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

// Close implements driver.Subscription. With PassOn, a wake-up a waiter
// received but did not consume goes to the next waiter of the key without
// one pending. Close is idempotent and never fails.
func (s *Sub) Close() error {
	s.once.Do(func() {
		r := s.r
		r.mu.Lock()
		m := r.subs
		if s.observer {
			m = r.obs
		}
		subs := m[s.key]
		for i, x := range subs {
			if x == s {
				subs = append(subs[:i:i], subs[i+1:]...)
				break
			}
		}
		if r.PassOn && !s.observer {
			select {
			case <-s.c:
				r.wakeOneLocked(s.key, s)
			default:
			}
		}
		if len(subs) == 0 {
			delete(m, s.key)
		} else {
			m[s.key] = subs
		}
		last := len(r.subs[s.key]) == 0 && len(r.obs[s.key]) == 0
		r.mu.Unlock()
		if last && r.Idle != nil {
			r.Idle(s.key)
		}
	})
	return nil
}
