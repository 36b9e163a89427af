package fencedsqlite

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fenced-dev/fenced/internal/backend/leasetable"
	"github.com/fenced-dev/fenced/internal/backend/waitqueue"
)

// The waiter queue. A process (a Driver) stands in a key's queue, the table
// TABLE_waiters, while it has waiters for the key: one entry per waiting
// episode (internal/backend/waitqueue), from its first waiter's Subscribe to its
// last waiter's Close. Each entry has a doorbell of its own, a file named
// after the entry in the directory FILE.waiters, which only its process
// watches (inotify on the file). A commit that may free a key (release,
// break, an episode's end) rings the doorbell of the entry that has stood
// longest, and only that one, then takes the entry off the queue. The rung
// process wakes one of its waiters for that key, which tries. With 64
// waiting processes, one wakes and tries; the 63 others sleep. Before, the
// one doorbell FILE.wake woke them all, and each read the lease table and
// raced for SQLite's write lock.
//
// A woken waiter whose try is refused (another process took the key first)
// puts its entry at the end of the queue again; so does a process that was
// served and has more waiters for the key (waitqueue.Hooks.Requeue), so a
// process with many waiters takes turns with the others. A ring takes an
// entry off the queue only at the place it rang it, so an entry that stood
// again since keeps its new place.
//
// A process holds a shared flock on each of its doorbells; the kernel
// drops it when the process dies. The ringer opens the doorbell (the open
// is the ring) and tries an exclusive flock on it without waiting: if it
// gets one, nobody holds the doorbell, so its process is gone. That entry
// and its doorbell are deleted, and the next entry is rung.
//
// A rung process acknowledges the ring: its watcher sets the doorbell's
// modification time as it hears it (queue.heard). The ringer looks for
// that, in the background, up to ackLooks times ackEvery apart. A process
// alive but not running (SIGSTOP, a debugger, a frozen container) does not
// acknowledge, and the ring passes on to the next entry: one stopped
// process delays the next waiter by about ackLooks*ackEvery, not until its
// fallback timer. A ring is taken off the queue whether acknowledged or
// not; a stopped process that runs again finds the key taken at its
// waiter's try, and its refused try stands it at the end of the queue.
//
// The queue's rows are hints, never grants: the woken process still asks
// for the key. They need no durability (after a crash of the host every
// waiter is gone), so a driver opened with OpenFile writes them on
// connections of their own with synchronous=NORMAL: in WAL mode such a
// commit costs no fsync. Lease commits stay FULL; each syncs the log up to
// itself, queue frames included.
//
// The shared doorbell FILE.wake still rings on every release and break:
// it wakes observers, which see every release, and processes that could
// not make doorbells of their own (a read-only directory, no inotify),
// which then wait as before.

// waitersSuffix names the queue table: the lease table's name plus it.
const waitersSuffix = "_waiters"

// waitersDirSuffix names the directory of the doorbells beside the
// database file: FILE.waiters.
const waitersDirSuffix = ".waiters"

// ringLimit is how many entries one ring takes off a key's queue at most,
// looking for one whose process is alive.
const ringLimit = 8

// How long a ringer waits for a rung process's acknowledgement (see
// above): ackLooks looks, ackEvery apart. Counting looks rather than time
// stretches the wait when the ringer is short of CPU, as the rung process
// most likely is too then (a live process acknowledges within a
// millisecond on an idle host); ackCap bounds it all the same. A live
// process that was too slow only costs a second wake-up: the next
// process tries too, and one of the two is refused.
const (
	ackEvery = time.Millisecond
	ackLooks = 25
	ackCap   = 250 * time.Millisecond
)

// closeGrace bounds how long Close waits for the queue's work in flight.
const closeGrace = time.Second

// queueTimeout bounds the queue's writes in the background (an episode's
// end, an entry put at the end).
const queueTimeout = 5 * time.Second

var waitersShape = leasetable.Shape{
	Columns: []leasetable.Column{
		{Name: "member", Type: "text", Identity: true},
		{Name: "key", Type: "text", Identity: true},
		{Name: "seq", Type: "integer"},
	},
	Key: "member",
}

// queueQueries are the statements of the waiter queue.
type queueQueries struct {
	stand, requeue, leave, first, pop string
}

func newQueueQueries(t string) queueQueries {
	r := strings.NewReplacer("T_", t, "NOW", now)
	const last = `COALESCE((SELECT max(seq) FROM T__waiters WHERE key = ?1), 0) + 1`
	return queueQueries{
		// stand puts member at the end of key's queue.
		stand: r.Replace(`INSERT INTO T__waiters (member, key, seq) VALUES (?2, ?1, ` + last + `)
ON CONFLICT (member) DO NOTHING`),
		// requeue puts member at the end of key's queue wherever it is.
		requeue: r.Replace(`INSERT INTO T__waiters (member, key, seq) VALUES (?2, ?1, ` + last + `)
ON CONFLICT (member) DO UPDATE SET seq = excluded.seq`),
		leave: r.Replace(`DELETE FROM T__waiters WHERE member = ?1`),
		// first is the first entry of key's queue and its place, if the
		// key is free, passing over the members of the JSON array ?2
		// (rung, not acknowledged): a key granted again by now is rung
		// by its next release.
		first: r.Replace(`SELECT member, seq FROM T__waiters WHERE key = ?1
  AND member NOT IN (SELECT value FROM json_each(?2))
  AND NOT EXISTS (SELECT 1 FROM T_ WHERE key = ?1 AND owner IS NOT NULL AND expires_ms > NOW)
ORDER BY seq LIMIT 1`),
		// pop takes member off the queue unless it stood again since.
		pop: r.Replace(`DELETE FROM T__waiters WHERE member = ?1 AND seq = ?2`),
	}
}

// episodeBell is the doorbell of one of this process's entries, held with
// a shared flock and watched while the entry stands.
type episodeBell struct {
	path string
	f    *os.File
	wd   int32
}

// queue is the driver's side of the waiter queue.
type queue struct {
	d   *Driver
	db  *sql.DB // the queue's writes: d.db, or a pool with synchronous=NORMAL
	own bool    // db is the queue's own pool, closed with it
	dir string  // FILE.waiters; "" for an in-memory database
	q   queueQueries

	mu     sync.Mutex
	ev     *fileEvents             // this process's inotify instance, made on first use
	noEv   bool                    // inotify is unavailable
	bells  map[string]*episodeBell // by member
	rung   map[string]bool         // members rung since they last stood
	gave   bool                    // doorbells cannot be made here, or the driver closed
	closed bool
	rings  sync.WaitGroup // ringNext calls running: close waits for them
	passed atomic.Int64   // rings passed on unacknowledged, for the tests
	ctx    context.Context
	cancel context.CancelFunc
	eps    *waitqueue.Queue[string]
}

func (q *queue) init(d *Driver, dbPath string) {
	q.d, q.db = d, d.db
	q.q = newQueueQueries(d.table)
	q.ctx, q.cancel = context.WithCancel(context.Background())
	q.bells = map[string]*episodeBell{}
	q.rung = map[string]bool{}
	if dbPath != "" {
		q.dir = dbPath + waitersDirSuffix
	}
	id := make([]byte, 8)
	rand.Read(id)
	q.eps = waitqueue.New(hex.EncodeToString(id), waitqueue.Hooks[string]{Leave: q.leave, Requeue: q.requeue})
}

// events returns the driver's inotify instance, starting it on first use;
// nil where inotify is unavailable or the driver closed.
func (q *queue) events() *fileEvents {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.eventsLocked()
}

func (q *queue) eventsLocked() *fileEvents {
	if q.ev == nil && !q.noEv && !q.closed {
		ev, err := newFileEvents()
		if err != nil {
			q.noEv = true
			return nil
		}
		q.ev = ev
	}
	return q.ev
}

// join counts a new waiter for key in. The first of an episode makes the
// entry's doorbell, starts watching it, and stands the entry at the end of
// key's queue. stood is false where the doorbell could not be made (the
// waiter then listens to the shared doorbell) or the write failed.
func (q *queue) join(ctx context.Context, key string) (ep *waitqueue.Episode, stood bool) {
	ep = q.eps.Join(key)
	q.mu.Lock()
	_, had := q.bells[ep.Member()]
	made := had || q.makeBellLocked(key, ep.Member())
	q.mu.Unlock()
	if !made {
		return ep, false
	}
	if had {
		return ep, true
	}
	if _, err := q.db.ExecContext(ctx, q.q.stand, key, ep.Member()); err != nil {
		// Not in the queue: without its doorbell the episode counts as
		// not standing, and its waiters hear the shared doorbell.
		q.dropBell(ep.Member())
		return ep, false
	}
	return ep, true
}

// makeBellLocked makes member's doorbell (creating the directory), with
// the database file's permissions, holds it with a shared flock, and
// watches it. A failure makes this driver's waiters use the shared
// doorbell from then on.
func (q *queue) makeBellLocked(key, member string) bool {
	if q.gave || q.dir == "" {
		return false
	}
	ev := q.eventsLocked()
	b, err := makeBell(q.dir, member, q.d.bell.mode)
	if err == nil && ev == nil {
		err = errors.New("no inotify")
		b.remove()
	}
	if err == nil {
		if b.wd, err = ev.watchEpisode(b.path, key); err != nil {
			b.remove()
		}
	}
	if err != nil {
		q.gave = true
		return false
	}
	q.bells[member] = b
	return true
}

func makeBell(dir, member string, mode os.FileMode) (*episodeBell, error) {
	// Directories need search permission wherever the file has read.
	if err := os.Mkdir(dir, mode|(mode&0o444)>>2); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, err
	}
	// A link in the directory's place would put the doorbells wherever
	// it points (New refused one at open; this is one made since).
	if err := checkBeside(dir, true); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, member)
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, mode)
	if err != nil {
		return nil, err
	}
	if fi, err := f.Stat(); err == nil && fi.Mode().Perm() != mode {
		f.Chmod(mode) // best effort, as the umask narrowed it
	}
	b := &episodeBell{path: path, f: f}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); err != nil {
		b.remove()
		return nil, err
	}
	return b, nil
}

// remove deletes the doorbell, then lets go of it: a ringer that opens it
// in between finds it held, as it still was.
func (b *episodeBell) remove() {
	os.Remove(b.path)
	b.f.Close()
}

// dropBell stops watching member's doorbell and removes it.
func (q *queue) dropBell(member string) {
	q.mu.Lock()
	b := q.bells[member]
	delete(q.bells, member)
	delete(q.rung, member)
	ev := q.ev
	q.mu.Unlock()
	if b == nil {
		return
	}
	if ev != nil {
		ev.unwatch(b.wd)
	}
	b.remove()
}

// standing reports whether this process has an entry with a doorbell in
// key's queue (or is about to stand again).
func (q *queue) standing(key string) bool {
	_, ok := q.entry(key)
	return ok
}

// entry returns this process's entry in key's queue, if it has one with a
// doorbell.
func (q *queue) entry(key string) (member string, ok bool) {
	n, member := q.eps.Current(key)
	if n == 0 {
		return "", false
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	_, ok = q.bells[member]
	return member, ok
}

// heard records that this process's entry in key's queue was rung (and
// is being taken off the queue), and acknowledges the ring.
func (q *queue) heard(key string) {
	if member, ok := q.entry(key); ok {
		q.mu.Lock()
		q.rung[member] = true
		if b := q.bells[member]; b != nil {
			b.ack()
		}
		q.mu.Unlock()
	}
}

// ack acknowledges a ring of the doorbell: it moves the doorbell's
// modification time on, which its ringer looks for (see acked). The time
// is set through the open file, which this process made and owns.
func (b *episodeBell) ack() {
	t := time.Now().Truncate(time.Microsecond)
	if fi, err := b.f.Stat(); err == nil && !t.After(fi.ModTime()) {
		t = fi.ModTime().Truncate(time.Microsecond).Add(time.Second) // a coarse clock, or a file system's
	}
	tv := syscall.NsecToTimeval(t.UnixNano())
	syscall.Futimes(int(b.f.Fd()), []syscall.Timeval{tv, tv})
}

// refused puts this process's entry at the end of key's queue after a
// refused try, if the entry was rung since it last stood: its waiter found
// the key taken by someone else. The new place keeps the ringer's delete
// (of the place it rang) from taking it off. A refused try of an entry not
// rung changes nothing: the entry keeps its place.
func (q *queue) refused(ctx context.Context, key string) {
	member, ok := q.entry(key)
	if !ok {
		return
	}
	q.mu.Lock()
	rung := q.rung[member]
	delete(q.rung, member)
	q.mu.Unlock()
	if rung {
		q.db.ExecContext(ctx, q.q.requeue, key, member)
	}
}

// leave is waitqueue.Hooks.Leave: it removes member's doorbell, takes the
// entry off key's queue and, if the key is free, rings the next entry (a
// wake-up this process took but did not use would otherwise be lost).
func (q *queue) leave(_ context.Context, key, member string) {
	ctx, cancel := context.WithTimeout(q.ctx, queueTimeout)
	defer cancel()
	q.dropBell(member)
	if _, err := q.db.ExecContext(ctx, q.q.leave, member); err != nil {
		return
	}
	q.ringNext(ctx, key)
}

// requeue is waitqueue.Hooks.Requeue: it puts member at the end of key's
// queue (a ring may have taken it off), and rings the first entry if the
// key is free (a release may have found the queue without it).
func (q *queue) requeue(_ context.Context, key, member string) {
	ctx, cancel := context.WithTimeout(q.ctx, queueTimeout)
	defer cancel()
	q.mu.Lock()
	_, ok := q.bells[member]
	delete(q.rung, member)
	q.mu.Unlock()
	if !ok {
		return
	}
	if _, err := q.db.ExecContext(ctx, q.q.requeue, key, member); err != nil {
		return
	}
	q.ringNext(ctx, key)
}

// ringNext rings the first entry of key's queue whose process is alive, if
// the key is free, and takes the entries it rang or found dead off the
// queue. A ring not acknowledged in time is passed on, in the background
// (see ringFrom).
func (q *queue) ringNext(ctx context.Context, key string) {
	q.ringFrom(ctx, key, nil)
}

// ringFrom is ringNext, passing over the members in passed: rung already,
// they did not acknowledge. One call looks at ringLimit entries at most,
// rung ones in passed included, so a release rings at most ringLimit
// entries that do not acknowledge.
func (q *queue) ringFrom(ctx context.Context, key string, passed []string) {
	q.mu.Lock()
	if q.closed || q.dir == "" {
		q.mu.Unlock()
		return
	}
	q.rings.Add(1)
	q.mu.Unlock()
	defer q.rings.Done()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(q.ctx, cancel)()
	for looked := len(passed); looked < ringLimit; looked++ {
		skip, _ := json.Marshal(append([]string{}, passed...))
		var member string
		var seq int64
		if err := q.db.QueryRowContext(ctx, q.q.first, key, string(skip)).Scan(&member, &seq); err != nil {
			return // none, or the store failed: the waiters' timers find the key
		}
		// Ring first, then take the entry off: the write does not delay
		// the wake-up. A rung entry is taken off in the background, so
		// that a release, whose commit is done, never waits for the
		// write lock (another process may hold it, stopped), nor for
		// the acknowledgement; the place rung keeps a late delete from
		// taking off the entry's new place. An entry passed over is
		// taken off before the next look.
		r := ringMember(q.dir, member)
		if r.result != rung {
			q.db.ExecContext(ctx, q.q.pop, member, seq)
			continue
		}
		// The delete goes at once, as the rung waiter's try, which also
		// needs the write lock, comes a little later; the look for the
		// acknowledgement runs beside it.
		passed := append(passed[:len(passed):len(passed)], member)
		q.rings.Add(2)
		go func() {
			defer q.rings.Done()
			pctx, cancel := context.WithTimeout(q.ctx, queueTimeout)
			defer cancel()
			q.db.ExecContext(pctx, q.q.pop, member, seq)
		}()
		go func() {
			defer q.rings.Done()
			actx, cancel := context.WithTimeout(q.ctx, queueTimeout)
			defer cancel()
			acked := r.acked(actx)
			r.f.Close()
			if !acked {
				q.passed.Add(1)
				q.ringFrom(actx, key, passed)
			}
		}()
		return
	}
}

// ringResult is what ringing an entry's doorbell found.
type ringResult int

const (
	rung        ringResult = iota // its process is alive and was rung
	gone                          // its process is gone, or its episode ended
	unreachable                   // the doorbell cannot be opened (permissions)
)

// ring is a ring of an entry's doorbell: what it found and, if rung, the
// doorbell (open) and its modification time before the ring.
type ring struct {
	result ringResult
	f      *os.File
	before time.Time
}

// ringMember rings the doorbell of member in dir. A doorbell that nobody
// holds (its process died) is removed. A rung doorbell is left open for
// acked, whose caller closes it.
func ringMember(dir, member string) ring {
	if member == "" || strings.ContainsAny(member, `/\`) || member == "." || member == ".." {
		return ring{result: gone} // not a member a driver writes
	}
	path := filepath.Join(dir, member)
	// The time before the open: the rung process may acknowledge before
	// the ringer looks at the open file.
	var before time.Time
	if fi, err := os.Lstat(path); err == nil {
		before = fi.ModTime()
	}
	// The open is the ring. Neither a symbolic link nor a FIFO put there
	// by someone else can make it open something else or block (see
	// openBeside).
	f, err := openBeside(path, false, false, 0)
	if errors.Is(err, os.ErrNotExist) {
		return ring{result: gone}
	}
	if err != nil {
		return ring{result: unreachable}
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		// Held (EWOULDBLOCK): alive. Anything else (a file system
		// without flock): cannot tell, so taken as alive.
		return ring{result: rung, f: f, before: before}
	}
	os.Remove(path)
	syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	f.Close()
	return ring{result: gone}
}

// acked reports whether the rung process acknowledged the ring (see
// queue.heard) within ackLooks looks, ackEvery apart, and ackCap. A
// doorbell removed meanwhile counts as acknowledged: its process is
// running and ended its episode, and its leave rings the next entry.
func (r ring) acked(ctx context.Context) bool {
	t := time.NewTimer(ackCap)
	defer t.Stop()
	for range ackLooks {
		fi, err := r.f.Stat()
		if err != nil || !fi.ModTime().Equal(r.before) {
			return true
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink == 0 {
			return true
		}
		select {
		case <-ctx.Done():
			return true // closing: nothing more to ring
		case <-t.C:
			return false
		case <-time.After(ackEvery):
		}
	}
	return false
}

// close ends the queue's background work: it waits for the episodes'
// ends and the rings in flight (a release that raced with Close) up to
// closeGrace, then cancels them. It removes this process's doorbells and
// stops inotify; entries left in queues go as rings find their doorbells
// gone.
func (q *queue) close() {
	grace := time.AfterFunc(closeGrace, q.cancel)
	defer grace.Stop()
	q.eps.Close()
	q.mu.Lock()
	q.gave, q.closed = true, true
	bells, ev := q.bells, q.ev
	q.bells, q.ev = map[string]*episodeBell{}, nil
	q.mu.Unlock()
	q.rings.Wait()
	q.cancel()
	if q.own {
		q.db.Close()
	}
	for _, b := range bells {
		b.remove()
	}
	if ev != nil {
		ev.close()
	}
}
