package fencedmysql

import (
	"context"
	"crypto/sha256"
	"database/sql"
	sqldriver "database/sql/driver"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/backend/sessionlock"
)

// Waiting by doorbell.
//
// MySQL has no LISTEN/NOTIFY, but a named lock (GET_LOCK) is a wait that
// the server ends when another session lets go: one sleeper per
// RELEASE_LOCK, in the server, with no polling. Each key has a doorbell,
// a named lock derived from the database, the lease table and the key.
// It is a hint and nothing else: the lease row stays the only authority
// (owner, fence, expiry), every grant is decided by the row's one
// statement, and a doorbell held by the wrong session, or by nobody,
// only makes a waiter look at the row later than it could have.
//
// The doorbell is held by the head of the key's line: the session that
// holds the lease, or the one waiter that is polling for it. In each
// process one waiter per key (the head of the process's local line) waits
// on its own connection in SELECT GET_LOCK(bell, T), with T no longer than
// the time the holder has left (plus a millisecond) and never more than
// maxBellSleep. The other waiters of the process wait for their turn in
// the line.
//
//   - Release frees the row first, then the doorbell (RELEASE_LOCK), so
//     the one sleeper the server wakes finds the row free, takes it in one
//     statement, and keeps the doorbell with its grant: a release wakes one
//     waiter, whatever the number of waiters or processes.
//   - A waiter whose GET_LOCK returns 1 but finds the row held (the
//     holder took the key without the doorbell, or died holding it) is the
//     head of the line: it keeps the doorbell and polls the row with
//     backoff, capped by the holder's remaining time, until it wins.
//   - A GET_LOCK that times out is followed by a look at the row: a holder
//     that crashed or is stopped (SIGSTOP) with the doorbell still held by
//     its connection strands nobody past its grant's expiry, and at worst
//     makes the next handovers wait up to maxBellSleep until its session
//     goes (a process killed: its connection drops and the server frees its
//     named locks; a stopped one: until it resumes, finds its grant lost,
//     and rings).
//   - A waiter tries the row before it sleeps, after it joined the line,
//     so a release between its refused try and its sleep is not missed.
//   - KILL QUERY ends a GET_LOCK with NULL, a dropped connection with an
//     error: the waiter looks at the row and waits again (on a new
//     connection).
//   - The doorbell connections of a driver are bounded (Options.Bells);
//     without a free one a waiter polls the row with backoff, as a driver
//     without doorbells would.
//
// Named locks need MySQL 5.7+ or MariaDB 10.0.2+ (a session may hold
// several); their names are at most 64 characters, so the doorbell's name
// is a digest. A server whose GET_LOCK counts whole seconds (it returns
// early on a fractional timeout) is detected, and then the last second of
// a grant is waited by polling.

// defaultBells is the default bound of a driver's doorbell connections.
const defaultBells = 8

// maxBellSleep bounds one GET_LOCK wait, so that a doorbell held by a
// session that will not ring (a stopped process) delays handovers by no
// more than this. (Atomic, for the tests that prove a release wakes a
// sleeper well before it would look again anyway.)
var maxBellSleep atomic.Int64

func init() { maxBellSleep.Store(int64(2 * time.Second)) }

// Polling backoff of a waiter without the doorbell's help (head of the line,
// or without a connection) is full jitter between 0 and a ceiling of pollMin
// << attempt. The ceiling is at most pollFast for the first pollFastTries
// attempts and pollSlow after. The holder's remaining time caps it. It
// starts short: the usual reason to poll is a holder that took the key
// without its doorbell and holds it briefly. pollSlow bounds the cost of a
// holder that keeps such a key for long. That is 4 looks a second at most,
// by one waiter per key across all processes; the others sleep on the
// doorbell the poller holds.
const (
	pollMin       = time.Millisecond
	pollFast      = 64 * time.Millisecond
	pollSlow      = 250 * time.Millisecond
	pollFastTries = 20
)

// doorbell is a driver's part of waiting by doorbell.
type doorbell struct {
	d      *Driver
	prefix string // database and table, hashed with each key
	slots  chan struct{}

	mu      sync.Mutex
	pool    *sql.DB // where doorbell connections come from
	ownPool bool
	// contended holds the keys this driver's waiters found held lately,
	// with when: a grant of such a key taken at once takes the doorbell
	// too, so that its release wakes the waiters that will come.
	contended map[string]time.Time
	rung      map[driver.Grant]*rung // grants (TTL zeroed) holding their key's doorbell
	lines     map[string]*line
	closed    bool
	// wholeSeconds is set once the server was seen to round GET_LOCK's
	// timeout down to whole seconds (MySQL before fractional timeouts).
	wholeSeconds bool
}

// line is the local line of a key: head holds a token while a waiter of
// this process is the head.
type line struct {
	head    chan struct{}
	waiters int
}

func newDoorbell(d *Driver, pool *sql.DB, database string, bells int) *doorbell {
	return &doorbell{
		d: d, pool: pool, prefix: database + "\x00" + d.table + "\x00",
		slots: make(chan struct{}, bells),
		rung:  map[driver.Grant]*rung{}, lines: map[string]*line{}, contended: map[string]time.Time{},
	}
}

// name is key's doorbell: a digest, since named locks are server-wide and
// at most 64 characters; hex, since their names compare case-insensitively.
func (b *doorbell) name(key string) string {
	sum := sha256.Sum256([]byte(b.prefix + key))
	return "fenced:" + hex.EncodeToString(sum[:20])
}

// conn takes a slot and a connection for a doorbell, or reports false
// when every slot is taken or no connection came quickly.
func (b *doorbell) conn(ctx context.Context) (*sql.Conn, bool) {
	select {
	case b.slots <- struct{}{}:
	default:
		return nil, false
	}
	b.mu.Lock()
	pool, closed, own := b.pool, b.closed, b.ownPool
	b.mu.Unlock()
	if closed {
		<-b.slots
		return nil, false
	}
	if !own {
		// The caller's pool: doorbells take at most half of its limit,
		// so renewals and the application's own statements always find
		// a connection.
		if m := pool.Stats().MaxOpenConnections; m > 0 && len(b.slots) > m/2 {
			<-b.slots
			return nil, false
		}
	}
	// A pool at its limit must not hold the waiter up: it polls instead.
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	c, err := pool.Conn(cctx)
	if err != nil {
		<-b.slots
		return nil, false
	}
	return c, true
}

// put gives back a doorbell connection and its slot. A connection that
// may still hold a doorbell (ringing: the release failed) is closed, so
// the server frees its named locks.
func (b *doorbell) put(c *sql.Conn, clean bool) {
	if !clean {
		c.Raw(func(any) error { return sqldriver.ErrBadConn })
	}
	c.Close()
	<-b.slots
}

// ring frees the doorbell held on c and gives c back.
func (b *doorbell) ring(c *sql.Conn, key string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := c.ExecContext(ctx, "DO RELEASE_LOCK('"+b.name(key)+"')")
	b.put(c, err == nil)
}

// rung is a grant's hold on its key's doorbell.
type rung struct {
	c   *sql.Conn
	ttl time.Duration
	// expire rings the doorbell when the grant was neither renewed nor
	// released for its TTL (its holder forgot it): a doorbell never
	// outlives its grant by more than that.
	expire *time.Timer
}

// attach records that g's process holds g's key's doorbell on c.
func (b *doorbell) attach(g driver.Grant, c *sql.Conn) {
	ttl := g.TTL
	g.TTL = 0
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		b.ring(c, g.Key)
		return
	}
	old := b.rung[g]
	b.rung[g] = &rung{c: c, ttl: ttl, expire: time.AfterFunc(ttl, func() { b.done(g) })}
	b.mu.Unlock()
	if old != nil {
		old.expire.Stop()
		b.ring(old.c, g.Key)
	}
}

// take detaches and returns the connection holding g's doorbell, nil if
// this process does not hold it for g.
func (b *doorbell) take(g driver.Grant) *sql.Conn {
	g.TTL = 0
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.rung[g]
	if r == nil {
		return nil
	}
	delete(b.rung, g)
	r.expire.Stop()
	return r.c
}

// renewed pushes back the expiry of the doorbells held for the grants
// whose renewal succeeded (errs[i] == nil; errs nil for one grant).
func (b *doorbell) renewed(grants []driver.Grant, errs []error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.rung) == 0 {
		return
	}
	for i, g := range grants {
		if errs != nil && errs[i] != nil {
			continue
		}
		g.TTL = 0
		if r := b.rung[g]; r != nil {
			r.expire.Reset(r.ttl)
		}
	}
}

// done rings g's doorbell if its process holds it: g was released, or
// found lost.
func (b *doorbell) done(g driver.Grant) {
	if c := b.take(g); c != nil {
		b.ring(c, g.Key)
	}
}

// contendedWindow is how long a key counts as contended after a waiter
// of the driver found it held.
const contendedWindow = 10 * time.Second

func (b *doorbell) markContended(key string) {
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.contended) >= 1024 {
		for k, t := range b.contended {
			if now.Sub(t) > contendedWindow {
				delete(b.contended, k)
			}
		}
	}
	if len(b.contended) < 4096 {
		b.contended[key] = now
	}
}

func (b *doorbell) wasContended(key string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	t, ok := b.contended[key]
	if ok && time.Since(t) > contendedWindow {
		delete(b.contended, key)
		ok = false
	}
	return ok
}

// takeFree takes g's key's doorbell for g if it is free (g was granted at
// once on a key contended lately).
func (b *doorbell) takeFree(ctx context.Context, g driver.Grant) {
	c, ok := b.conn(ctx)
	if !ok {
		return
	}
	if !b.tryBell(ctx, c, g.Key) {
		b.put(c, true)
		return
	}
	b.attach(g, c)
}

// doneKey rings key's doorbell whichever grant of this process holds it
// (after a break).
func (b *doorbell) doneKey(key string) {
	b.mu.Lock()
	var gs []driver.Grant
	for g := range b.rung {
		if g.Key == key {
			gs = append(gs, g)
		}
	}
	b.mu.Unlock()
	for _, g := range gs {
		b.done(g)
	}
}

// close rings every doorbell held and closes the doorbell pool if the
// driver opened it. Waiters end with their contexts (the portable client
// cancels them at Close).
func (b *doorbell) close() {
	b.mu.Lock()
	b.closed = true
	held := b.rung
	b.rung = map[driver.Grant]*rung{}
	b.mu.Unlock()
	for g, r := range held {
		r.expire.Stop()
		b.ring(r.c, g.Key)
	}
	if b.ownPool {
		b.pool.Close()
	}
}

// join adds a waiter to key's local line.
func (b *doorbell) join(key string) *line {
	b.mu.Lock()
	defer b.mu.Unlock()
	l := b.lines[key]
	if l == nil {
		l = &line{head: make(chan struct{}, 1)}
		b.lines[key] = l
	}
	l.waiters++
	return l
}

func (b *doorbell) leave(key string, l *line) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if l.waiters--; l.waiters == 0 {
		delete(b.lines, key)
	}
}

// timeout is T of the next GET_LOCK for a holder with remaining left: a
// millisecond past its expiry, at most maxBellSleep; zero when the server
// cannot wait that short (then the waiter polls).
func (b *doorbell) timeout(remaining time.Duration) time.Duration {
	t := time.Duration(maxBellSleep.Load())
	if remaining > 0 {
		t = min(t, remaining+time.Millisecond)
	}
	b.mu.Lock()
	whole := b.wholeSeconds
	b.mu.Unlock()
	if whole {
		t = t.Truncate(time.Second)
	}
	return t
}

// sleep waits on key's doorbell on c for t. It reports whether the
// waiter now holds the doorbell, and false with an error when c must be
// dropped (the query failed: connection killed or ctx ended).
func (b *doorbell) sleep(ctx context.Context, c *sql.Conn, key string, t time.Duration) (bool, error) {
	start := time.Now()
	var got sql.NullInt64
	q := fmt.Sprintf("SELECT GET_LOCK('%s', %.6f)", b.name(key), t.Seconds())
	if err := c.QueryRowContext(ctx, q).Scan(&got); err != nil {
		return false, err
	}
	if got.Valid && got.Int64 == 0 && t >= 20*time.Millisecond && time.Since(start) < t/2 {
		// A timeout long before t: the server counts whole seconds.
		b.mu.Lock()
		b.wholeSeconds = true
		b.mu.Unlock()
	}
	if !got.Valid {
		// KILL QUERY (or an error in the server): no doorbell. Pause a
		// little, so that repeated kills cannot make the waiter spin.
		sessionlock.Pause(ctx, pollMin)
	}
	return got.Valid && got.Int64 == 1, nil
}

// tryBell takes key's doorbell on c if it is free.
func (b *doorbell) tryBell(ctx context.Context, c *sql.Conn, key string) bool {
	var got sql.NullInt64
	err := c.QueryRowContext(ctx, "SELECT GET_LOCK('"+b.name(key)+"', 0)").Scan(&got)
	return err == nil && got.Valid && got.Int64 == 1
}

// pollSleep is a poller's sleep before attempt n, full jitter, capped by
// the holder's remaining time.
func pollSleep(n int, remaining time.Duration) time.Duration {
	ceil := pollSlow
	if n < pollFastTries {
		ceil = min(pollFast, pollMin<<n)
	}
	s := rand.N(ceil) + 1
	if remaining > 0 {
		s = min(s, remaining+time.Millisecond)
	}
	return s
}

// heldRemaining is the holder's remaining time a refusal reports (0 when
// unknown).
func heldRemaining(err error) time.Duration {
	var held *fenced.HeldError
	if errors.As(err, &held) {
		return held.Remaining
	}
	return 0
}

// AcquireTimed implements driver.TimedQueuer. It is declared only with
// doorbells on; with them off it refuses with fenced.ErrUnsupported. It
// tries the row once. While the key is held, the head of the key's local
// line waits on the key's doorbell (see the comment at the top of bell.go).
// It tries the row again each time the doorbell rings or the holder's time
// runs out. The grant is confirmed when the try that granted it was sent.
// Errors while waiting (server unreachable, outcome unknown: the owner token
// makes a retried try idempotent) are retried until ctx ends. Those of the
// first try are returned, so that a caller that fails open can.
func (d *Driver) AcquireTimed(ctx context.Context, key, owner string, ttl time.Duration) (uint64, time.Time, error) {
	if cap(d.bell.slots) == 0 {
		return 0, time.Time{}, fmt.Errorf("mysql: wait in a queue: %w: doorbells are off (Options.Bells < 0)", fenced.ErrUnsupported)
	}
	sent := time.Now()
	fence, err := d.TryAcquire(ctx, key, owner, ttl)
	b := d.bell
	if err == nil && b.wasContended(key) {
		b.takeFree(ctx, driver.Grant{Key: key, Owner: owner, Fence: fence, TTL: ttl})
	}
	if !errors.Is(err, fenced.ErrHeld) {
		return fence, sent, err
	}
	b.markContended(key)
	l := b.join(key)
	defer b.leave(key, l)
	w := &waiter{b: b, key: key, owner: owner, ttl: ttl, remaining: heldRemaining(err)}
	select {
	case l.head <- struct{}{}:
		// Head at once: the refused try above is this head's first look.
		// A release between it and the first GET_LOCK is not missed: the
		// doorbell is then free and GET_LOCK returns at once.
		w.looked = true
	default:
		select {
		case l.head <- struct{}{}:
		case <-ctx.Done():
			return 0, time.Time{}, context.Cause(ctx)
		}
	}
	defer func() { <-l.head }()
	defer w.leave()
	return w.wait(ctx)
}

// waiter is the head of a key's local line.
type waiter struct {
	b          *doorbell
	key, owner string
	ttl        time.Duration
	remaining  time.Duration // the holder's time left at the last refusal
	c          *sql.Conn     // doorbell connection, nil without one
	noConn     bool          // no connection was available: poll
	ringing    bool          // c holds the doorbell
	polls      int
	looked     bool // the row was tried since the waiter became the head
}

func (w *waiter) wait(ctx context.Context) (uint64, time.Time, error) {
	// A head that waited for its turn looks at once: the key may have
	// been released while it waited.
	for first := true; ; first = false {
		if !first || w.looked {
			if err := w.pause(ctx); err != nil {
				return 0, time.Time{}, err
			}
		}
		sent := time.Now()
		fence, err := w.b.d.TryAcquire(ctx, w.key, w.owner, w.ttl)
		switch {
		case err == nil:
			w.granted(ctx, driver.Grant{Key: w.key, Owner: w.owner, Fence: fence, TTL: w.ttl})
			return fence, sent, nil
		case errors.Is(err, fenced.ErrHeld):
			w.remaining = heldRemaining(err)
		case ctx.Err() != nil:
			return 0, time.Time{}, context.Cause(ctx)
		case errors.Is(err, fenced.ErrUnavailable), errors.Is(err, fenced.ErrUnknownOutcome):
			w.remaining = 0
			if !sessionlock.Pause(ctx, sessionlock.RetryPause) {
				return 0, time.Time{}, context.Cause(ctx)
			}
		default:
			return 0, time.Time{}, err
		}
	}
}

// pause waits until the next look at the row: on the doorbell when the
// waiter can sleep on it, else a poller's backoff.
func (w *waiter) pause(ctx context.Context) error {
	if w.c == nil && !w.noConn {
		w.c, w.noConn = nil, true
		if c, ok := w.b.conn(ctx); ok {
			w.c, w.noConn = c, false
		}
	}
	t := w.b.timeout(w.remaining)
	if w.c == nil || w.ringing || t <= 0 {
		w.polls++
		if !sessionlock.Pause(ctx, pollSleep(w.polls, w.remaining)) {
			return context.Cause(ctx)
		}
		return nil
	}
	got, err := w.b.sleep(ctx, w.c, w.key, t)
	if err != nil {
		// The connection is gone (killed, or ctx ended mid-wait, which
		// closes it): the server frees whatever it held. A server that
		// refuses GET_LOCK itself (a Galera node, a proxy) makes this
		// waiter poll from now on. Either way it pauses before its next
		// look, so that a failing doorbell cannot make it spin.
		w.b.put(w.c, false)
		w.c = nil
		var myErr *mysql.MySQLError
		if errors.As(err, &myErr) && !transientBellError[myErr.Number] {
			w.noConn = true
		}
		w.polls++
		if !sessionlock.Pause(ctx, pollSleep(w.polls, w.remaining)) {
			return context.Cause(ctx)
		}
		return nil
	}
	w.ringing = got
	w.polls = 0
	return nil
}

// transientBellError are the server errors of a doorbell wait after
// which the waiter tries a doorbell again: query interrupted (KILL QUERY,
// on servers that report it as an error), connection killed, server
// shutting down, too many connections.
var transientBellError = map[uint16]bool{1317: true, 1927: true, 1053: true, 1040: true}

// granted keeps the doorbell with grant g: the one it woke with, or, when
// it got the grant without it (the holder's time ran out), the doorbell if
// it is free.
func (w *waiter) granted(ctx context.Context, g driver.Grant) {
	if w.c == nil {
		return
	}
	if !w.ringing && !w.b.tryBell(ctx, w.c, w.key) {
		return
	}
	w.b.attach(g, w.c)
	w.c, w.ringing = nil, false
}

// leave gives back the waiter's connection, ringing the doorbell if it
// holds it without a grant (it gave up): the next sleeper becomes the
// head.
func (w *waiter) leave() {
	switch {
	case w.c == nil:
	case w.ringing:
		w.b.ring(w.c, w.key)
	default:
		w.b.put(w.c, true)
	}
}

// note is the waiting part of Capabilities().Note.
func (b *doorbell) note() string {
	if cap(b.slots) == 0 {
		return "doorbells off: waiters poll with backoff and full jitter, capped by the holder's remaining time"
	}
	return "waiters are woken by a doorbell (a named lock, GET_LOCK, held by the holder and freed after its release: " +
		"one waiter woken per release, " +
		"one sleeping connection per key per process), with a look at the row at the holder's expiry or every 2s at the latest; not FIFO"
}

// Release implements driver.Driver: the row, then the doorbell if this
// process holds it for g, whatever the row said (g is over either way).
// The row is released through the pool, never through the doorbell's
// connection, so a doorbell connection that was killed cannot make a
// release fail.
func (d *Driver) Release(ctx context.Context, g driver.Grant) error {
	err := d.Engine.Release(ctx, g)
	d.bell.done(g)
	return err
}

// Renew implements driver.Driver; a grant found lost rings its doorbell.
func (d *Driver) Renew(ctx context.Context, g driver.Grant) error {
	err := d.Engine.Renew(ctx, g)
	switch {
	case err == nil:
		d.bell.renewed([]driver.Grant{g}, nil)
	case errors.Is(err, fenced.ErrNotHeld):
		d.bell.done(g)
	}
	return err
}

// RenewBatch implements driver.BatchRenewer; a grant found lost rings its
// doorbell.
func (d *Driver) RenewBatch(ctx context.Context, grants []driver.Grant) ([]error, error) {
	errs, err := d.Engine.RenewBatch(ctx, grants)
	if err == nil {
		d.bell.renewed(grants, errs)
	}
	for i, e := range errs {
		if errors.Is(e, fenced.ErrNotHeld) {
			d.bell.done(grants[i])
		}
	}
	return errs, err
}

// Break implements driver.Driver; a broken grant of this process rings
// its doorbell. (A holder in another process rings when it finds its
// grant lost; until then its key's waiters look at the row at least every
// maxBellSleep.)
func (d *Driver) Break(ctx context.Context, key string, reason, by string) (driver.LeaseInfo, error) {
	info, err := d.Engine.Break(ctx, key, reason, by)
	if err == nil {
		d.bell.doneKey(key)
	}
	return info, err
}
