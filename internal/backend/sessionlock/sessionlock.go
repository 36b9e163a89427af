// Package sessionlock is the core that the session-based backends (etcd
// and ZooKeeper) share: both hold a lease as a key (or znode) attached to
// a server session, queue waiters in creation order, and lose a grant when
// the key disappears.
//
// The core does the parts that do not depend on the store:
//
//   - Grants tracks the keys a driver put (or may have put, after an
//     unknown outcome) by lease key and owner, and ends (through the
//     driver's delete function) those whose deadline passes without a
//     renewal: a session outlives each of its grants, so a grant nobody
//     renews must still end after its TTL (see reaper.go).
//   - WaitTurn is the predecessor wait: look at the queue, wait for the key
//     ahead, look again, with a short pause after a transient failure.
//   - Loss delivers a driver.LossWatcher's report once, never after its
//     stop.
//   - Capabilities are the guarantees both stores give.
//
// The store-specific parts (sessions and keep-alives, how a key is put,
// ordered and found again after an unknown outcome) stay in the backends.
package sessionlock

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
)

// ID names a grant: the lease key and the owner token.
type ID struct{ Key, Owner string }

// Entry is what a backend tracks per key it put. Entries are compared
// with ==, so they are pointers in practice, to a struct that embeds
// Tracking.
type Entry interface {
	comparable
	// GrantID returns the grant the entry belongs to.
	GrantID() ID
	tracking() *Tracking
}

// Tracking is the state Grants keeps in each entry. A backend's entry
// type embeds it; the zero value is an entry Grants has not seen yet.
//
// An entry goes one way only: new, tracked (Track), ending, gone
// (forgotten). It is ending while its key is being deleted: its deadline
// passed, or EndNow. Once it has left "tracked", nothing brings it back. So
// a renewal or a release sent for an entry before it ended can never act on
// it afterwards, whatever it found at the store. It gets false from Extend,
// nil from Lookup.
type Tracking struct {
	state entryState // guarded by the Grants' mutex
}

func (t *Tracking) tracking() *Tracking { return t }

type entryState uint8

const (
	stateNew entryState = iota
	stateTracked
	stateEnding
	stateGone
)

// reapRetry is how long the reaper waits before trying a failed end again.
const reapRetry = time.Second

// Grants tracks a driver's entries, at most one current entry per ID,
// each with a deadline. It is safe for concurrent use.
type Grants[E Entry] struct {
	end    func([]E) []error
	forgot func(E)
	reaper *reaper[E]
	mu     sync.Mutex // taken before the reaper's own
	closed bool
	byID   map[ID]E
}

// NewGrants returns an empty Grants. end deletes an entry's key at the
// store, if it is still that entry's; a key already gone is not an error.
// end is called when an entry's deadline passes, and by EndNow. It is tried
// again every second until it succeeds. forgot, if not nil, is called once
// for every entry that is forgotten (by Forget, or after end succeeded). It
// is called with no lock held, so the driver can free what the entry
// reserved.
func NewGrants[E Entry](end func(E) error, forgot func(E)) *Grants[E] {
	return NewGrantsBatched(func(es []E) []error { return []error{end(es[0])} }, 1, forgot)
}

// NewGrantsBatched is NewGrants with an end that deletes the keys of up to
// batch entries in one request. It returns one error per entry. After an
// outage many thousands of grants may be due at once.
func NewGrantsBatched[E Entry](end func([]E) []error, batch int, forgot func(E)) *Grants[E] {
	g := &Grants[E]{end: end, forgot: forgot, byID: map[ID]E{}}
	g.reaper = newReaperBatched(g.reap, batch, reapRetry)
	return g
}

// reap is the reaper's end: it ends each of es whose deadline has passed
// (and was not moved meanwhile), or that EndNow made ending.
func (g *Grants[E]) reap(es []E) []error {
	errs := make([]error, len(es))
	var ending []E
	var at []int // positions in es of ending
	g.mu.Lock()
	for i, e := range es {
		switch e.tracking().state {
		case stateTracked:
			if dl, ok := g.reaper.Deadline(e); ok && time.Now().Before(dl) {
				continue // extended meanwhile: the reaper keeps it armed
			}
			g.startEndingLocked(e)
		case stateEnding:
		default:
			continue
		}
		ending = append(ending, e)
		at = append(at, i)
	}
	g.mu.Unlock()
	if len(ending) == 0 {
		return errs
	}
	var forgotten []E
	endErrs := g.end(ending)
	g.mu.Lock()
	for j, e := range ending {
		if endErrs[j] != nil {
			errs[at[j]] = endErrs[j]
			continue
		}
		t := e.tracking()
		if t.state == stateEnding {
			forgotten = append(forgotten, e)
		}
		t.state = stateGone
	}
	g.mu.Unlock()
	if g.forgot != nil {
		for _, e := range forgotten {
			g.forgot(e)
		}
	}
	return errs
}

// startEndingLocked moves e to ending: it is no longer the entry of its
// ID. g.mu must be held.
func (g *Grants[E]) startEndingLocked(e E) {
	e.tracking().state = stateEnding
	id := e.GrantID()
	if cur, ok := g.byID[id]; ok && cur == e {
		delete(g.byID, id)
	}
}

// Lookup returns the tracked entry of key and owner (the zero E if none).
func (g *Grants[E]) Lookup(key, owner string) E {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.byID[ID{key, owner}]
}

// Track records e, which Grants has not seen before, as the entry of its ID
// (replacing and disarming an older one). It arms e's deadline at from+ttl.
// It reports false, doing nothing, after Seal and for an entry it has seen
// before. To push a tracked entry's deadline back, use Extend.
func (g *Grants[E]) Track(e E, ttl time.Duration, from time.Time) bool {
	id := e.GrantID()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed || e.tracking().state != stateNew {
		return false
	}
	e.tracking().state = stateTracked
	old, had := g.byID[id]
	g.byID[id] = e
	if had && old != e {
		g.reaper.Forget(old)
	}
	g.reaper.Set(e, from.Add(ttl))
	return true
}

// Extend moves e's deadline to from+ttl if e is still the tracked entry of
// its ID, and reports whether it was. A renewal calls it once the store
// confirmed e's key. False means e ended meanwhile (its deadline passed, or
// it was ended or forgotten), whatever the store said. The renewal must
// then report the grant not held.
func (g *Grants[E]) Extend(e E, ttl time.Duration, from time.Time) bool {
	id := e.GrantID()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed || e.tracking().state != stateTracked || g.byID[id] != e {
		return false
	}
	g.reaper.Set(e, from.Add(ttl))
	return true
}

// Forget drops e and disarms its deadline, without ending it. An entry
// being ended is left to its end, which forgets it.
func (g *Grants[E]) Forget(e E) {
	t := e.tracking()
	id := e.GrantID()
	g.mu.Lock()
	if t.state == stateEnding || t.state == stateGone {
		g.mu.Unlock()
		return
	}
	t.state = stateGone
	if cur, ok := g.byID[id]; ok && cur == e {
		delete(g.byID, id)
	}
	g.reaper.Forget(e)
	g.mu.Unlock()
	if g.forgot != nil {
		g.forgot(e)
	}
}

// Deadline returns e's deadline, if it is armed.
func (g *Grants[E]) Deadline(e E) (time.Time, bool) { return g.reaper.Deadline(e) }

// EndNow deletes e's key now and forgets e. It runs on the caller's
// goroutine, without the caller's context, which may be done. If that
// fails, the reaper keeps trying in the background. From the call on, e is
// no longer tracked: Lookup does not return it and Extend refuses it.
func (g *Grants[E]) EndNow(e E) {
	g.mu.Lock()
	switch e.tracking().state {
	case stateNew, stateTracked:
		g.startEndingLocked(e)
	default:
		g.mu.Unlock()
		return // being ended, or gone
	}
	g.mu.Unlock()
	_ = g.reaper.EndNow(e)
}

// Seal stops Track from recording entries and returns those tracked now.
func (g *Grants[E]) Seal() []E {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = true
	left := make([]E, 0, len(g.byID))
	for _, e := range g.byID {
		left = append(left, e)
	}
	return left
}

// Close seals g, disarms every deadline and waits for ends in progress.
func (g *Grants[E]) Close() {
	g.Seal()
	g.reaper.Close()
}

// RetryPause is how long WaitTurn pauses after a transient failure before
// it looks at the queue again.
const RetryPause = 100 * time.Millisecond

// Pause waits d or until ctx ends; it reports whether d passed.
func Pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// WaitTurn is the predecessor wait of a queued acquisition. step looks at
// the queue once. It reports true when the caller's key is the oldest (the
// grant). Or else it waits for the key just ahead of it to go, or for
// anything that makes another look worthwhile, and reports false. An error
// for which retry reports true (the store did not answer, a watch broke) is
// followed by RetryPause and another look. Any other error ends the wait.
// Once ctx ends, WaitTurn returns context.Cause(ctx) unless step reported
// the grant.
func WaitTurn(ctx context.Context, step func(context.Context) (bool, error), retry func(error) bool) error {
	for {
		granted, err := step(ctx)
		switch {
		case err == nil && granted:
			return nil
		case ctx.Err() != nil:
			return context.Cause(ctx)
		case err == nil:
		case !retry(err):
			return err
		case !Pause(ctx, RetryPause):
			return context.Cause(ctx)
		}
	}
}

// Loss delivers one loss watch's report (see driver.LossWatcher): at most
// once, and never once Stop has returned. It is safe for concurrent use.
type Loss struct {
	mu   sync.Mutex
	done bool
	lost func(error)
}

// NewLoss returns a Loss that reports to lost.
func NewLoss(lost func(error)) *Loss { return &Loss{lost: lost} }

// Report calls lost with err, unless a report was made or Stop called
// before. lost runs with the Loss locked, so a Stop waits for it (lost
// must not block, nor call Stop).
func (l *Loss) Report(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done {
		return
	}
	l.done = true
	l.lost(err)
}

// Stop ends l: no report is made after it returns.
func (l *Loss) Stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.done = true
}

// Capabilities returns the guarantees of a session-lock backend, which its
// drivers' Capabilities start from. The fence is
// strict, ordered by the consensus log. Expiry is on the leader's monotonic
// clock (safe from clock steps). Waiters are woken by a watch on their
// predecessor and served in arrival order. note says where the fence comes
// from and how the session covers a grant.
func Capabilities(note string) driver.Capabilities {
	return driver.Capabilities{
		Fence:         fenced.FenceStrict,
		ServerClock:   true,
		ClockStepSafe: true,
		Note:          note,
	}
}

// Endpoints splits a URL host list "host:port[,host:port...]" and checks
// each part. what names a part in errors ("etcd endpoint", "ZooKeeper
// server"); errors wrap fenced.ErrInvalidURL.
func Endpoints(hosts, what string) ([]string, error) {
	var out []string
	for _, hp := range strings.Split(hosts, ",") {
		host, port, err := net.SplitHostPort(hp)
		if err != nil || host == "" {
			return nil, fmt.Errorf("%w: %s %q is not host:port", fenced.ErrInvalidURL, what, hp)
		}
		if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
			return nil, fmt.Errorf("%w: %s %q has a bad port", fenced.ErrInvalidURL, what, hp)
		}
		out = append(out, hp)
	}
	return out, nil
}
