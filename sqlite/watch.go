package sqlite

import (
	"context"
	"database/sql"
	"strings"
	"sync"
	"time"

	"github.com/fenced-dev/fenced/driver"
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
	d *Driver

	mu   sync.Mutex
	subs map[string]map[*subscription]struct{}
	stop context.CancelFunc
	done chan struct{}
}

type subscription struct {
	w   *watcher
	key string
	c   chan struct{}
}

func (s *subscription) C() <-chan struct{} { return s.c }

func (s *subscription) Close() error {
	s.w.mu.Lock()
	defer s.w.mu.Unlock()
	delete(s.w.subs[s.key], s)
	if len(s.w.subs[s.key]) == 0 {
		delete(s.w.subs, s.key)
	}
	if len(s.w.subs) == 0 && s.w.stop != nil {
		s.w.stop()
		s.w.stop = nil
	}
	return nil
}

// Subscribe implements driver.Notifier with change detection (see watcher).
func (d *Driver) Subscribe(ctx context.Context, key string) (driver.Subscription, error) {
	w := &d.watch
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.subs == nil {
		w.d = d
		w.subs = map[string]map[*subscription]struct{}{}
	}
	s := &subscription{w: w, key: key, c: make(chan struct{}, 1)}
	if w.subs[key] == nil {
		w.subs[key] = map[*subscription]struct{}{}
	}
	w.subs[key][s] = struct{}{}
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
	w.mu.Lock()
	keys := make([]any, 0, len(w.subs))
	for k := range w.subs {
		keys = append(keys, k)
	}
	w.mu.Unlock()
	if len(keys) == 0 {
		return
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
		w.mu.Lock()
		for s := range w.subs[k] {
			select {
			case s.c <- struct{}{}:
			default:
			}
		}
		w.mu.Unlock()
	}
}
