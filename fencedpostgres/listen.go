package fencedpostgres

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"sync"
	"time"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/driver/wakeup"
	"github.com/jackc/pgx/v5"
)

// probePayload is the payload of the startup probe notification. Keys are
// never empty, so it cannot be mistaken for a release.
const probePayload = ""

// listener wakes the driver's waiters when a key they wait for is
// released or broken (pg_notify on the driver's channel, with the key as
// payload), one waiter per release across every driver on the database:
// see line. A waiter that leaves with a wake-up unconsumed, or forwards
// one it consumed (driver.WakeForwarder), hands it on to the next waiter
// of the key in this driver.
//
// Why so few LISTENing connections: PostgreSQL (through at least 17) signals
// every backend that LISTENs on any channel of the database at every NOTIFY,
// and each of them must read the notification queue. With 64 idle drivers
// listening, one waiter's handover took 9.8 ms instead of 1.3 ms on a 2-core
// machine. So a connection LISTENs only while it has a notification to wait
// for. A line's connection does while it is the head of its key's line. The
// listener's own connection does only while this driver waits for a key that
// has no line, or observes a key.
//
// Observers (SubscribeObserver: election observers, fenced observe) never
// join a line. A line hands each notification to one waiter. An observer
// that held a key's line would take every wake-up and act on none. Every
// candidate in every process would be left to its fallback timer. The
// listener's own connection LISTENs while this driver has observers and
// wakes them at every notification of their key.
type listener struct {
	d   *Driver
	cfg *pgx.ConnConfig

	wake  wakeup.Registry // waiters by key, woken one per release
	probe chan struct{}   // signalled on a probe payload

	ctx    context.Context // ends at close
	cancel context.CancelFunc
	done   chan struct{}

	mu        sync.Mutex
	lines     map[string]*line // keys with a line
	lineless  map[string]bool  // waited-for keys without a line
	observed  map[string]int   // observers per key
	interrupt func()           // ends the listener's current wait, to LISTEN or UNLISTEN
	spare     *pgx.Conn        // a connected line connection, so a first wait need not connect
	wg        sync.WaitGroup   // line and spare goroutines
}

// startListener connects, LISTENs, and proves that a notification sent
// through the driver's pool reaches the listening connection within
// timeout (it would not behind a transaction-mode pooler). Then it serves
// notifications until close.
func startListener(ctx context.Context, d *Driver, cfg *pgx.ConnConfig, timeout time.Duration) (*listener, error) {
	l := &listener{d: d, cfg: cfg, probe: make(chan struct{}, 1), done: make(chan struct{}),
		lines: map[string]*line{}, lineless: map[string]bool{}, observed: map[string]int{}}
	l.wake.PassOn = true // one wake-up per release: a waiter that leaves hands it on
	conn, err := l.connect(ctx)
	if err != nil {
		return nil, err
	}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	go l.run(l.ctx, conn)
	if _, err := d.pool.Exec(ctx, `SELECT pg_notify($1, $2)`, d.channel, probePayload); err != nil {
		l.close()
		return nil, fmt.Errorf("probe notification: %w", err)
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-l.probe:
		l.fillSpare()
		return l, nil
	case <-t.C:
		l.close()
		return nil, fmt.Errorf("a probe notification sent through the pool did not reach the LISTEN connection within %v", timeout)
	case <-ctx.Done():
		l.close()
		return nil, ctx.Err()
	}
}

func (l *listener) connect(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, l.cfg)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+quoteIdent(l.d.channel)); err != nil {
		conn.Close(context.Background())
		return nil, err
	}
	return conn, nil
}

// wantsListen reports whether the listener's connection must LISTEN: until
// the startup probe arrived, while a waited-for key has no line, and
// while a key is observed.
func (l *listener) wantsListen(probed bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !probed || l.listensLocked()
}

func (l *listener) listensLocked() bool { return len(l.lineless) > 0 || len(l.observed) > 0 }

// run delivers notifications of keys without a line, and reconnects (with
// backoff) when the connection breaks. After a reconnect every
// subscription is woken, since releases may have been missed while it was
// down.
func (l *listener) run(ctx context.Context, conn *pgx.Conn) {
	defer close(l.done)
	backoff := 50 * time.Millisecond
	listening, probed := true, false
	for {
		for conn == nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 5*time.Second)
			c, err := l.connect(ctx)
			if err == nil {
				conn, listening = c, true
				backoff = 50 * time.Millisecond
				l.wake.WakeEvery()
			}
		}
		if want := l.wantsListen(probed); want != listening {
			cmd := "UNLISTEN "
			if want {
				cmd = "LISTEN "
			}
			if _, err := conn.Exec(ctx, cmd+quoteIdent(l.d.channel)); err != nil {
				conn.Close(context.Background())
				conn = nil
				if ctx.Err() != nil {
					return
				}
				l.wake.WakeEvery()
				continue
			}
			listening = want
			if want {
				// Releases before the LISTEN took effect were not heard.
				l.wakeLineless()
			}
		}
		wctx, stop := context.WithCancel(ctx)
		l.mu.Lock()
		l.interrupt = stop
		l.mu.Unlock()
		if l.wantsListen(probed) != listening {
			stop() // changed meanwhile
		}
		n, err := conn.WaitForNotification(wctx)
		stop()
		if err != nil {
			if ctx.Err() != nil {
				conn.Close(context.Background())
				return
			}
			if wctx.Err() != nil && !conn.IsClosed() {
				continue // interrupted to LISTEN or UNLISTEN
			}
			conn.Close(context.Background())
			conn = nil
			// Waiters keep their fallback timers while the connection is
			// re-established; wake them so they check once now.
			l.wake.WakeEvery()
			continue
		}
		if n.Payload == probePayload {
			probed = true
			select {
			case l.probe <- struct{}{}:
			default:
			}
			continue
		}
		l.mu.Lock()
		mine, watched := l.lineless[n.Payload], l.observed[n.Payload] > 0
		l.mu.Unlock()
		switch {
		case mine:
			l.wake.WakeOne(n.Payload) // and its observers
		case watched:
			l.wake.WakeObservers(n.Payload) // its line serves its waiters
		}
	}
}

// wakeLineless wakes one waiter of each key without a line, and the
// observers of every observed key.
func (l *listener) wakeLineless() {
	l.mu.Lock()
	keys := make([]string, 0, len(l.lineless))
	for k := range l.lineless {
		keys = append(keys, k)
	}
	watched := make([]string, 0, len(l.observed))
	for k := range l.observed {
		watched = append(watched, k)
	}
	l.mu.Unlock()
	for _, k := range keys {
		l.wake.WakeOne(k)
	}
	for _, k := range watched {
		l.wake.WakeObservers(k)
	}
}

func (l *listener) close() {
	l.cancel()
	<-l.done
	l.wg.Wait()
	l.mu.Lock()
	spare := l.spare
	l.spare = nil
	l.mu.Unlock()
	if spare != nil {
		spare.Close(context.Background())
	}
}

// fillSpare connects a spare line connection in the background unless
// there is one.
func (l *listener) fillSpare() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.spare != nil || l.ctx.Err() != nil {
		return
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		c, err := pgx.ConnectConfig(l.ctx, l.lineConfig())
		if err != nil {
			return
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.spare == nil && l.ctx.Err() == nil {
			l.spare, c = c, nil
		}
		if c != nil {
			c.Close(context.Background())
		}
	}()
}

// takeSpare returns the spare line connection, or nil, and starts
// connecting the next one.
func (l *listener) takeSpare() *pgx.Conn {
	l.mu.Lock()
	c := l.spare
	l.spare = nil
	l.mu.Unlock()
	if c != nil {
		l.fillSpare()
	}
	return c
}

// keepSpare keeps c, a line's connection that is no longer needed, as the
// spare if there is none, and reports whether it did.
func (l *listener) keepSpare(c *pgx.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.spare != nil || l.ctx.Err() != nil || c.IsClosed() {
		return false
	}
	l.spare = c
	return true
}

// A line orders the waiters of one key across drivers (processes). So a
// release wakes one waiter in all, not one per driver (docs/design-notes.md
// says why).
//
// Each driver that has waiters of key queues for a session advisory lock
// derived from the key (pg_advisory_lock on a connection of its own, granted
// in the server's arrival order). The driver that holds it is the head: only
// its line connection LISTENs, and it hands a notification of key to one of
// its waiters. The others neither listen nor look. A head gives the lock up
// when one of its waiters leaves, most often because it was granted the key.
// The next driver in the server's queue then becomes head. A driver that
// becomes head wakes one of its waiters at once to look at the row. So no
// release is lost: not one the previous head did not act on (its waiter gave
// up, or its process died and the server ended its session), nor one that
// came before the LISTEN.
//
// Nothing depends on the line for safety. A wake-up is only a hint, and
// every grant is the row's conditional upsert. Every waiter keeps the
// client's fallback timer, capped by the time a refused acquire reports left
// on the grant. A head that stops (SIGSTOP, a network cut that leaves its
// session open) delays the others by at most that timer.
//
// The lock id is a pair of int4s from a SHA-256 of the channel and key, in
// the two-int space of pg_advisory_lock. That space never collides with the
// bigint ids of WithAdvisoryLock (AdvisoryKey). Two keys whose pair collides
// only share a line. A driver keeps at most maxLines lines; waiters of
// further keys are woken through the listener's connection, one per driver
// per release.
type line struct {
	key  string
	a, b int32
	kick chan struct{} // a waiter of key came or went

	// Guarded by listener.mu:
	head  bool   // holds the lock
	yield bool   // a waiter left while head: give the lock up
	stop  func() // ends the head's current wait for a notification
}

// maxLines bounds the connections a driver opens for lines.
const maxLines = 32

// lineLinger is how long a line keeps its connection after its last
// waiter left, so that waiting for the same key again does not connect
// again.
const lineLinger = 5 * time.Second

// lineSub is a subscription whose Close tells the listener.
type lineSub struct {
	*wakeup.Sub
	l *listener
}

// Close implements driver.Subscription. A wake-up s did not consume goes
// to the next waiter in this driver, and a line that was head gives the
// lock up to the next driver.
func (s lineSub) Close() error {
	s.Sub.Close()
	s.l.left(s.Key())
	return nil
}

// observerSub is an observer's subscription, served by the listener's
// connection.
type observerSub struct {
	*wakeup.Sub
	l *listener
}

// Close implements driver.Subscription.
func (s observerSub) Close() error {
	s.Sub.Close()
	l := s.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.observed[s.Key()]--; l.observed[s.Key()] <= 0 {
		delete(l.observed, s.Key())
		if !l.listensLocked() && l.interrupt != nil {
			l.interrupt() // UNLISTEN
		}
	}
	return nil
}

// observe returns an observer's subscription to key: the listener's
// connection LISTENs for it, and it never joins key's line.
func (l *listener) observe(key string) driver.Subscription {
	s := observerSub{Sub: l.wake.Observe(key), l: l}
	l.mu.Lock()
	defer l.mu.Unlock()
	first := !l.listensLocked()
	l.observed[key]++
	if first && l.interrupt != nil {
		l.interrupt() // LISTEN
	}
	return s
}

func (l *listener) subscribe(key string) driver.Subscription {
	s := lineSub{Sub: l.wake.Subscribe(key), l: l}
	l.mu.Lock()
	defer l.mu.Unlock()
	ln := l.lines[key]
	if ln == nil && len(l.lines) < maxLines && l.ctx.Err() == nil && !l.lineless[key] {
		sum := sha256.Sum256([]byte("fenced-line:" + l.d.channel + ":" + key))
		ln = &line{key: key, kick: make(chan struct{}, 1),
			a: int32(binary.BigEndian.Uint32(sum[0:4])), b: int32(binary.BigEndian.Uint32(sum[4:8]))}
		l.lines[key] = ln
		l.wg.Add(1)
		go l.runLine(ln)
	}
	if ln != nil {
		ln.signal()
	} else {
		l.setLinelessLocked(key)
	}
	return s
}

// setLinelessLocked makes the listener's connection serve the waiters of
// key, which has no line.
func (l *listener) setLinelessLocked(key string) {
	if !l.lineless[key] {
		first := !l.listensLocked()
		l.lineless[key] = true
		if first && l.interrupt != nil {
			l.interrupt() // LISTEN
		}
	}
}

// unsetLinelessLocked undoes setLinelessLocked.
func (l *listener) unsetLinelessLocked(key string) {
	if l.lineless[key] {
		delete(l.lineless, key)
		if !l.listensLocked() && l.interrupt != nil {
			l.interrupt() // UNLISTEN
		}
	}
}

// left notes that a waiter of key left.
func (l *listener) left(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.wake.Waiting(key) {
		l.unsetLinelessLocked(key)
	}
	if ln := l.lines[key]; ln != nil {
		if ln.head {
			ln.yield = true
			if ln.stop != nil {
				ln.stop()
			}
		}
		ln.signal()
	}
}

func (ln *line) signal() {
	select {
	case ln.kick <- struct{}{}:
	default:
	}
}

// runLine keeps ln's place in the server's queue while this driver has
// waiters of its key, serves notifications while ln is head, and removes
// ln after lineLinger without waiters.
func (l *listener) runLine(ln *line) {
	defer l.wg.Done()
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	ctx := l.ctx
	for {
		if !l.wake.Waiting(ln.key) {
			t := time.NewTimer(lineLinger)
			select {
			case <-ln.kick:
				t.Stop()
				continue
			case <-ctx.Done():
				t.Stop()
				l.drop(ln)
				return
			case <-t.C:
			}
			l.mu.Lock()
			if !l.wake.Waiting(ln.key) {
				delete(l.lines, ln.key)
				l.mu.Unlock()
				if conn != nil && l.keepSpare(conn) {
					conn = nil
				}
				return
			}
			l.mu.Unlock()
			continue
		}
		if conn == nil {
			// A release while the line connects is looked at when it
			// becomes head.
			c, err := l.takeSpare(), error(nil)
			if c == nil {
				c, err = pgx.ConnectConfig(ctx, l.lineConfig())
			}
			if err != nil {
				// The listener's connection serves this key's waiters.
				l.drop(ln)
				return
			}
			conn = c
		}
		if !l.queue(ctx, ln, conn) || !l.serveHead(ctx, ln, conn) {
			conn.Close(context.Background())
			conn = nil
			// A notification may have been missed; fall back to a look.
			l.wake.WakeOne(ln.key)
			if ctx.Err() != nil {
				l.drop(ln)
				return
			}
		}
	}
}

// lineConfig is the listener's connection config for a line: its wait
// for the lock may last as long as the key is held, so no server or role
// default timeout ends it.
func (l *listener) lineConfig() *pgx.ConnConfig {
	cfg := l.cfg.Copy()
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams["statement_timeout"] = "0"
	cfg.RuntimeParams["lock_timeout"] = "0"
	cfg.RuntimeParams["application_name"] = "fenced line"
	return cfg
}

// queue waits on conn for ln's lock and reports whether ln is head now.
// It gives up (false: conn must be closed, which abandons the wait) when
// this driver no longer has waiters of the key, or the wait fails.
func (l *listener) queue(ctx context.Context, ln *line, conn *pgx.Conn) bool {
	qctx, cancel := context.WithCancel(ctx)
	defer cancel()
	got := make(chan error, 1)
	go func() {
		_, err := conn.Exec(qctx, `SELECT pg_advisory_lock($1, $2)`, ln.a, ln.b)
		got <- err
	}()
	var err error
wait:
	for {
		select {
		case err = <-got:
			break wait
		case <-ln.kick:
			if !l.wake.Waiting(ln.key) {
				cancel()
			}
		}
	}
	if err != nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	ln.head, ln.yield = true, false
	return true
}

// serveHead LISTENs on conn, wakes one waiter to look at the row, and
// wakes one waiter per notification of ln's key until a waiter leaves;
// then it gives the lock up. It reports false if conn failed.
func (l *listener) serveHead(ctx context.Context, ln *line, conn *pgx.Conn) bool {
	defer func() {
		l.mu.Lock()
		ln.head, ln.yield, ln.stop = false, false, nil
		l.mu.Unlock()
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+quoteIdent(l.d.channel)); err != nil {
		return false
	}
	l.wake.WakeOne(ln.key)
	for {
		wctx, stop := context.WithCancel(ctx)
		l.mu.Lock()
		done := ln.yield || !l.wake.Waiting(ln.key)
		ln.stop = stop
		l.mu.Unlock()
		if done {
			stop()
			break
		}
		n, err := conn.WaitForNotification(wctx)
		stop()
		if err != nil {
			if ctx.Err() != nil || conn.IsClosed() || wctx.Err() == nil {
				return false
			}
			continue // interrupted: a waiter left
		}
		if n.Payload == ln.key {
			l.wake.WakeOne(ln.key)
		}
	}
	// One round trip: stop listening, then let the next driver be head.
	uctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := conn.Exec(uctx, "UNLISTEN "+quoteIdent(l.d.channel)+"; SELECT pg_advisory_unlock("+fmt.Sprint(ln.a)+", "+fmt.Sprint(ln.b)+")")
	return err == nil
}

// drop removes ln, whose goroutine ends: the listener's connection serves
// this key's waiters from now on.
func (l *listener) drop(ln *line) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lines[ln.key] != ln {
		return
	}
	delete(l.lines, ln.key)
	ln.head = false
	if l.wake.Waiting(ln.key) {
		l.setLinelessLocked(ln.key)
	}
}
