package fencedsqlite

import (
	"context"
	"database/sql"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/driver/wakeup"
)

// watchEvery is how often the watcher reads PRAGMA data_version while
// somebody waits, where the doorbell cannot be watched (see doorbell). The
// read touches no table and takes no write lock.
const watchEvery = 2 * time.Millisecond

// watcher wakes waiters in this process when another connection (any process
// on the host) frees a key they wait for. SQLite cannot push notifications.
// So every driver rings doorbells after each commit that may have freed a
// key, once the commit is durable and visible (see doorbell): the doorbell
// of the entry first in the key's waiter queue (see queue.go), and the
// shared doorbell. The kernel tells the watcher (inotify). An idle waiter
// costs nothing, not even a timer, and no waiting depends on how long a
// commit takes.
//
// A ring of one of this process's entries wakes one waiter of its key at
// once, without a look at the table: the waiter's try decides. A waiter
// that leaves with a wake-up it did not use hands it on
// (wakeup.Registry.PassOn). So a release wakes one process, and one waiter
// in it: no herd, across keys or on one key's write lock.
//
// The watcher hears the shared doorbell only while it has subscribers that
// need it: observers, which see every release, and waiters whose process
// could not make a doorbell of its own. On its rings it reads PRAGMA
// data_version, which changes whenever another connection committed; only
// then does it read the watched keys, in one query, and wake the observers
// of each key that is free, and one waiter if the key's waiters stand in no
// queue. Where inotify is unavailable (an in-memory database, a platform
// without it, the watch limit reached) it reads data_version every
// watchEvery instead. A key freed without a ring (by another program, or
// by a process killed between its commit and the ring) is found at the
// client's fallback timer.
type watcher struct {
	d    *Driver
	wake wakeup.Registry // waiters by key

	mu      sync.Mutex
	stop    context.CancelFunc
	done    chan struct{}
	rearm   chan struct{} // a subscription may need a watch the loop lacks
	observe atomic.Bool   // a subscriber needs the shared doorbell
}

// idle stops the loop once no key has waiters.
func (w *watcher) idle(string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.wake.Len() == 0 && w.stop != nil {
		w.stop()
		w.stop = nil
	}
}

// Subscribe implements driver.Notifier with change detection (see watcher).
// The process stands in key's waiter queue until the subscription's Close
// (see queue.go). A failure to stand in it is not an error, the waiter
// then listens to the shared doorbell.
func (d *Driver) Subscribe(ctx context.Context, key string) (driver.Subscription, error) {
	// Subscribed before the entry stands: its first ring must find the
	// waiter.
	s := d.subscribe(key, false, false)
	ep, stood := d.queue.join(ctx, key)
	if !stood {
		d.watch.needShared()
	}
	return d.queue.eps.Sub(s, key, key, ep), nil
}

// SubscribeObserver implements driver.ObserveNotifier: an observer is
// woken whenever key is seen free, and never counts as a waiter.
func (d *Driver) SubscribeObserver(ctx context.Context, key string) (driver.Subscription, error) {
	return d.subscribe(key, true, true), nil
}

// subscribe registers a subscriber of key and makes sure the loop runs;
// shared says that it needs the shared doorbell.
func (d *Driver) subscribe(key string, observer, shared bool) driver.Subscription {
	w := &d.watch
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.d == nil {
		w.d = d
		w.wake.Idle = w.idle
		w.wake.PassOn = true
		w.rearm = make(chan struct{}, 1)
	}
	var s *wakeup.Sub
	if observer {
		s = w.wake.Observe(key)
	} else {
		s = w.wake.Subscribe(key)
	}
	if shared {
		w.observe.Store(true)
	}
	if w.stop == nil {
		if w.done != nil {
			<-w.done // the previous loop is exiting
		}
		lctx, cancel := context.WithCancel(context.Background())
		w.stop = cancel
		w.done = make(chan struct{})
		w.observe.Store(shared)
		go w.loop(lctx, w.done)
	} else {
		select {
		case w.rearm <- struct{}{}:
		default:
		}
	}
	return s
}

// needShared makes the running loop hear the shared doorbell (see
// subscribe).
func (w *watcher) needShared() {
	w.observe.Store(true)
	select {
	case w.rearm <- struct{}{}:
	default:
	}
}

// loop runs while the driver has subscribers. It takes no lock of the
// watcher's: subscribe waits for a stopped loop's end under w.mu.
func (w *watcher) loop(ctx context.Context, done chan struct{}) {
	defer close(done)
	ev := w.d.queue.events()
	var changed <-chan struct{}
	if ev != nil {
		changed = ev.changed
	}
	var conn *sql.Conn
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	var last int64 = -1
	// look wakes the subscribers of each watched key that is free (see
	// wakeFree), if another connection committed since the last look.
	look := func() {
		if conn == nil {
			c, err := w.d.db.Conn(ctx)
			if err != nil {
				return // waiters fall back to the client's timers
			}
			conn = c
		}
		var v int64
		if err := conn.QueryRowContext(ctx, `PRAGMA data_version`).Scan(&v); err == nil && v != last {
			w.wakeFree(ctx, conn)
			last = v
		}
	}
	// Subscribers that need the shared doorbell (observers, waiters
	// without a doorbell of their own) need looks: on its rings, or
	// every watchEvery where it cannot be watched.
	looks := false
	var ticker *time.Ticker
	var tick <-chan time.Time
	defer func() {
		if ticker != nil {
			ticker.Stop()
		}
	}()
	arm := func() {
		if !w.observe.Load() {
			return
		}
		looks = true
		if ev != nil && ev.watchShared(w.d.bell) == nil || ticker != nil {
			return
		}
		ticker = time.NewTicker(watchEvery)
		tick = ticker.C
	}
	arm()
	for {
		if ev != nil {
			keys := ev.take()
			for _, k := range keys {
				// An entry of this process was rung for k: one
				// waiter tries, whatever the key looks like now (if
				// it is taken again, the refused try stands the
				// process in the queue again).
				w.d.queue.heard(k)
				w.wake.WakeOne(k)
			}
		}
		if looks {
			// Also on the first look: a release may have come after
			// the waiter's own look and before the watch was armed.
			look()
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-tick:
		case <-w.rearm:
			// A new watch needs a look of its own after it is armed.
			arm()
			last = -1
		}
	}
}

// wakeFree wakes the observers of each watched key that is free now, and
// one waiter of it unless this process stands in the key's queue (its
// entry's ring wakes a waiter when its turn comes; a try out of turn would
// only lose the entry its place).
func (w *watcher) wakeFree(ctx context.Context, conn *sql.Conn) {
	waited := w.wake.Keys()
	if len(waited) == 0 {
		return
	}
	keys := make([]any, len(waited))
	for i, k := range waited {
		keys[i] = k
	}
	q := `SELECT key FROM ` + w.d.table + ` WHERE key IN (?` + strings.Repeat(", ?", len(keys)-1) +
		`) AND (owner IS NULL OR expires_ms <= ` + now + `)`
	rows, err := conn.QueryContext(ctx, q, keys...)
	if err != nil {
		return
	}
	defer rows.Close()
	for rows.Next() {
		var k string
		if rows.Scan(&k) != nil {
			return
		}
		if w.d.queue.standing(k) {
			w.wake.WakeObservers(k)
		} else {
			w.wake.WakeOne(k)
		}
	}
}
