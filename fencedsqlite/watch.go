package fencedsqlite

import (
	"context"
	"database/sql"
	"strings"
	"sync"
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
// So every driver rings a doorbell after each commit that may have freed a
// key, once the commit is durable and visible (see doorbell). The kernel
// tells the watcher (inotify). An idle waiter costs nothing, not even a
// timer, and no waiting depends on how long a commit takes. On each ring the
// watcher reads PRAGMA data_version, which changes whenever another
// connection committed; only then does it read the waited-for keys, in one
// query, and wake the waiters of the keys that are now free. No waiter
// touches the lease table until its key is free, so a release causes no
// herd, across keys or on one key's write lock. Where inotify is unavailable
// (an in-memory database, a platform without it, the watch limit reached)
// the watcher reads data_version every watchEvery instead. A key freed
// without a ring (by another program, or by a process killed between its
// commit and the ring) is found at the client's fallback timer.
type watcher struct {
	d    *Driver
	wake wakeup.Registry // waiters by key

	mu   sync.Mutex
	stop context.CancelFunc
	done chan struct{}
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
func (d *Driver) Subscribe(ctx context.Context, key string) (driver.Subscription, error) {
	return d.subscribe(key, false), nil
}

// SubscribeObserver implements driver.ObserveNotifier: an observer is
// woken whenever key is seen free, and never counts as a waiter.
func (d *Driver) SubscribeObserver(ctx context.Context, key string) (driver.Subscription, error) {
	return d.subscribe(key, true), nil
}

func (d *Driver) subscribe(key string, observer bool) driver.Subscription {
	w := &d.watch
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.d == nil {
		w.d = d
		w.wake.Idle = w.idle
	}
	var s *wakeup.Sub
	if observer {
		s = w.wake.Observe(key)
	} else {
		s = w.wake.Subscribe(key)
	}
	if w.stop == nil {
		if w.done != nil {
			<-w.done // the previous loop is exiting
		}
		lctx, cancel := context.WithCancel(context.Background())
		w.stop = cancel
		w.done = make(chan struct{})
		go w.loop(lctx, w.done)
	}
	return s
}

func (w *watcher) loop(ctx context.Context, done chan struct{}) {
	defer close(done)
	conn, err := w.d.db.Conn(ctx)
	if err != nil {
		return // waiters fall back to the client's timers
	}
	defer conn.Close()
	// Arm the watch before the first look, so no ring falls between them.
	var changed <-chan struct{}
	if ev, err := watchDoorbell(w.d.bell); err == nil {
		defer ev.close()
		changed = ev.changed
	} else {
		t := time.NewTicker(watchEvery)
		defer t.Stop()
		ticks := make(chan struct{})
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					select {
					case ticks <- struct{}{}:
					case <-ctx.Done():
						return
					}
				}
			}
		}()
		changed = ticks
	}
	var last int64 = -1
	for {
		var v int64
		if err := conn.QueryRowContext(ctx, `PRAGMA data_version`).Scan(&v); err != nil {
			if ctx.Err() != nil {
				return
			}
		} else if v != last {
			// Also on the first look: a release may have come after
			// the waiter's own look and before the watch was armed.
			w.wakeFree(ctx, conn)
			last = v
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}

// wakeFree wakes the subscribers of every watched key that is free now.
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
		w.wake.Wake(k)
	}
}
