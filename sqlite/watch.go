package sqlite

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
// somebody waits. The read touches no table and takes no write lock.
const watchEvery = 2 * time.Millisecond

// watcher wakes waiters in this process when another connection (any
// process on the host) frees a key they wait for. SQLite cannot push
// notifications, but PRAGMA data_version changes whenever another
// connection commits; only then does the watcher read the waited-for keys,
// in one query, and wake the waiters of the keys that are now free. No
// waiter touches the lease table until its key is free, so a release
// causes no herd, across keys or on one key's write lock.
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
	w := &d.watch
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.d == nil {
		w.d = d
		w.wake.Idle = w.idle
	}
	s := w.wake.Subscribe(key)
	if w.stop == nil {
		if w.done != nil {
			<-w.done // the previous loop is exiting
		}
		lctx, cancel := context.WithCancel(context.Background())
		w.stop = cancel
		w.done = make(chan struct{})
		go w.loop(lctx, w.done)
	}
	return s, nil
}

func (w *watcher) loop(ctx context.Context, done chan struct{}) {
	defer close(done)
	conn, err := w.d.db.Conn(ctx)
	if err != nil {
		return // waiters fall back to the client's timers
	}
	defer conn.Close()
	var last int64 = -1
	t := time.NewTicker(watchEvery)
	defer t.Stop()
	for {
		var v int64
		if err := conn.QueryRowContext(ctx, `PRAGMA data_version`).Scan(&v); err != nil {
			if ctx.Err() != nil {
				return
			}
		} else if v != last {
			if last != -1 {
				w.wakeFree(ctx, conn)
			}
			last = v
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
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
