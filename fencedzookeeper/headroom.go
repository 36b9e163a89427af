package fencedzookeeper

import (
	"context"
	"fmt"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/core/ttlrule"
)

// Session headroom: a holder's local validity must end before the server
// can expire its session. See "Sessions" in the package documentation for
// the argument; this file holds its parts.

// sessionTimeoutFor returns the session timeout a grant of ttl needs when
// the servers' tickTime is at most tick: T with T*7/8 >= ttl + tick, that
// is T >= ttl + tick + 2*keepaliveEvery(T). Rounded up to the millisecond,
// the unit ZooKeeper negotiates in.
func sessionTimeoutFor(ttl, tick time.Duration) time.Duration { return ExpiryFor(tick).Rounded(ttl) }

// ExpiryFor is how ZooKeeper keeps a grant when the servers' tickTime is at
// most tick. A grant gets a session of (TTL + tick)×8/7 (sessionTimeoutFor),
// at least minSessionTimeout (two ticks by default), expired on tick
// boundaries. TTLs go up to what ZooKeeper's default maxSessionTimeout of 20
// ticks covers (maxTTLFor).
func ExpiryFor(tick time.Duration) driver.Expiry {
	return driver.Expiry{
		Name: "ZooKeeper", Pad: tick, ScaleNum: 8, ScaleDen: 7, Granularity: time.Millisecond,
		Floor: 2 * tick, Sweep: tick, MinTTL: ttlrule.Min, MaxTTL: maxTTLFor(20*tick, tick),
		Note: fmt.Sprintf("the session is (TTL + tickTime)×8/7, at least minSessionTimeout, expired on tick boundaries; "+
			"figures assume tickTime %v and ZooKeeper's default sessions of 2 to 20 ticks", tick),
	}
}

// maxTTLFor returns the longest TTL a session of timeout t covers when the
// servers' tickTime is at most tick (the inverse of sessionTimeoutFor);
// zero or less when none.
func maxTTLFor(t, tick time.Duration) time.Duration { return t*7/8 - tick }

// keepaliveEvery is how often the driver sends a request of its own on a
// session of timeout t, so that the leader never goes long without news of
// the session.
func keepaliveEvery(t time.Duration) time.Duration { return t / 16 }

// minProbeTimeout is the session timeout asked for when probing the servers'
// minSessionTimeout, which they raise it to. It is small enough to learn any
// common minimum. It is large enough that the client's handshake deadlines
// (ten times two thirds of it) hold on a slow network.
const minProbeTimeout = 100 * time.Millisecond

// activity is a request of one session that the server answered.
type activity struct {
	session int64
	// sent is when the request was handed to the client library (no later
	// than it reached the server); done when its answer came back.
	sent, done time.Time
	// atLeader is set for the session's creation, which the leader itself
	// registers. Other requests reach the leader's session tracker only
	// through the follower that served them, at its next ping.
	atLeader bool
}

// record adds a to s's activity record, dropping entries too old to ever
// matter (sent more than a session timeout ago), and wakes waiters.
func (s *zsession) record(a activity) {
	s.mu.Lock()
	defer s.mu.Unlock()
	keep := s.acts[:0]
	for _, old := range s.acts {
		if old.sent.After(a.done.Add(-s.timeout)) {
			keep = append(keep, old)
		}
	}
	s.acts = append(keep, a)
	close(s.recorded)
	s.recorded = make(chan struct{})
}

// known returns the latest activity of session that the leader has
// certainly heard of by time at. It assumes the follower serving the
// session stays connected to the leader until then. That activity is the
// latest send time of a creation done by at, or of a request done by
// at-tick: the follower reported it at a ping in between (leaders ping
// every tickTime/2). ok is false when there is none. next is when the next
// entry that does not count yet will count (zero when none), so that a
// waiter knows when to look again.
func (s *zsession) known(session int64, at time.Time, tick time.Duration) (latest time.Time, ok bool, next time.Time,
	changed <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range s.acts {
		if a.session != session {
			continue
		}
		countsFrom := a.done.Add(tick)
		if a.atLeader {
			countsFrom = a.done
		}
		if countsFrom.After(at) {
			if next.IsZero() || countsFrom.Before(next) {
				next = countsFrom
			}
			continue
		}
		if !ok || a.sent.After(latest) {
			latest, ok = a.sent, true
		}
	}
	return latest, ok, next, s.recorded
}

// recordWrite notes a successful write (a create, delete or check
// transaction) of session sent at sent. It does so only if zc's connection
// still carries that session now that the answer is in. Every write passes
// through the leader. So, like a sync, a write answered on the session
// proves that the follower serving it reached the leader after it was sent.
// Every later read of the session reflects the leader's state when the
// write reached it: ZooKeeper answers a session in order, and a reconnect
// within the session only goes to a server at least as recent as its last
// answer.
func (s *zsession) recordWrite(session int64, sent time.Time) {
	if session == 0 || s.conn.SessionID() != session {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lastWrite.session != session || sent.After(s.lastWrite.sent) {
		s.lastWrite = activity{session: session, sent: sent}
	}
}

// writeProofAge bounds how old a write may be for a waiter's look to stand
// on it instead of a sync of its own (see leaderProof). The grant's validity
// then counts from the write. So this is the most of a ttl the waiter gives
// up.
func writeProofAge(ttl time.Duration) time.Duration { return ttl / 32 }

// leaderProof returns when the latest answered write of session on zc was
// sent. It reports false unless three things hold:
//
//   - the write was sent no earlier than notBefore, the start of the
//     caller's acquisition, which its validity may not precede;
//   - it was sent at most writeProofAge(ttl) before now;
//   - the session then had headroom for a grant of ttl valid from that
//     moment. This is the condition awaitHeadroom waits for, judged at the
//     write's sending, with the write as the request that reached the
//     leader.
//
// A listing sent now is then as good as one sent behind a sync at that
// moment. It reflects the leader's state when the write reached it, or
// later, and the leader keeps the session for ttl from the write's sending.
func (d *Driver) leaderProof(zc *zsession, session int64, notBefore, now time.Time, ttl time.Duration) (time.Time, bool) {
	zc.mu.Lock()
	w := zc.lastWrite
	zc.mu.Unlock()
	if session == 0 || w.session != session || w.sent.Before(notBefore) || w.sent.Before(now.Add(-writeProofAge(ttl))) {
		return time.Time{}, false
	}
	latest, ok, _, _ := zc.known(session, w.sent, d.tick)
	if !ok || latest.Add(zc.timeout).Before(w.sent.Add(ttl)) {
		return time.Time{}, false
	}
	return w.sent, true
}

// keepAlive sends a small request on zc every keepaliveEvery(zc.timeout)
// until the driver closes zc or itself, and records the answered ones. The
// client library's own pings (every third of the timeout) are not seen by
// the driver and count for nothing here.
//
// It does not wait for one answer before it sends the next (up to
// maxKeepalivesInFlight at a time). On a loaded server or connection an
// answer can take longer than the whole headroom of a grant (issue 38).
// Sent one after the other, the latest keep-alive sent would then be as old
// as the last answer took; sent on time, there is always one sent within
// keepaliveEvery, and a grant waits only for its answer.
func (d *Driver) keepAlive(zc *zsession) {
	defer d.wg.Done()
	every := keepaliveEvery(zc.timeout)
	inFlight := make(chan struct{}, maxKeepalivesInFlight)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-timer.C:
		case <-zc.stop:
			return
		case <-d.ctx.Done():
			return
		}
		// Only an answer within one known session counts (before the
		// connection is first established the session id is zero: try
		// again soon).
		session, sent := zc.conn.SessionID(), time.Now()
		if session == 0 {
			timer.Reset(min(every, keepaliveRetry))
			continue
		}
		select {
		case inFlight <- struct{}{}:
		default:
			// As many unanswered as a session timeout holds: the
			// connection is down, and they are answered or fail when it
			// comes back or closes.
			timer.Reset(every)
			continue
		}
		// Not waited for by Close: a request on a caller's connection that
		// is down returns only when it reconnects or is closed.
		go func() {
			defer func() { <-inFlight }()
			if _, _, err := zc.conn.Exists("/"); err == nil && zc.conn.SessionID() == session {
				zc.record(activity{session: session, sent: sent, done: time.Now()})
			}
		}()
		timer.Reset(every)
	}
}

// maxKeepalivesInFlight bounds the unanswered keep-alives of a session: a
// session timeout's worth (see keepaliveEvery).
const maxKeepalivesInFlight = 16

// keepaliveRetry is how soon a keep-alive is tried again when the
// connection has no session yet.
const keepaliveRetry = 20 * time.Millisecond

// awaitHeadroom returns once the session of zc is certain to outlive
// start+ttl at the server, even if it is cut off from the ensemble right
// after the caller's next request to the leader. That request (a sync or a
// create) proves the follower still reaches the leader. The condition is
// that the session's known activity plus its timeout reaches start+ttl.
// Normally that holds at once. After a pause of the process (or right after
// New), or on a loaded machine or network where answers come late, it waits
// for a keep-alive to be answered and reported. Any keep-alive sent after
// start covers the grant (the session timeout exceeds ttl), so waiting
// longer never weakens the check; it only shortens what is left of the
// grant's validity, which still runs from start. So it waits until start+ttl,
// past which no grant valid from start is worth making, and then gives up
// with ErrUnavailable (the connection is down, or answers take longer than
// the TTL). It gives up with ctx's error when ctx ends.
func (d *Driver) awaitHeadroom(ctx context.Context, zc *zsession, start time.Time, ttl time.Duration) error {
	return d.awaitHeadroomOf(ctx, zc, zc.conn.SessionID, start, ttl)
}

// awaitHeadroomOf is awaitHeadroom for the session that sessionID names
// at each look (a session that expired is replaced by a new one).
func (d *Driver) awaitHeadroomOf(ctx context.Context, zc *zsession, sessionID func() int64, start time.Time, ttl time.Duration) error {
	// Not start+(timeout-ttl), the last moment the session's last answer
	// before start could have been sent: an answer to a keep-alive sent
	// since start covers the grant as well, and under load it may take
	// longer than that to come (issue 38).
	giveUp := start.Add(ttl)
	for {
		now := time.Now()
		latest, ok, next, changed := zc.known(sessionID(), now, d.tick)
		if ok && !latest.Add(zc.timeout).Before(start.Add(ttl)) {
			return nil
		}
		if !now.Before(giveUp) {
			return fmt.Errorf("zookeeper: %w: no recent answer covers a %v grant in a %v session within the TTL (connection down?)",
				fenced.ErrUnavailable, ttl, zc.timeout)
		}
		wake := giveUp
		if !next.IsZero() && next.Before(wake) {
			wake = next
		}
		t := time.NewTimer(wake.Sub(now))
		select {
		case <-t.C:
		case <-changed:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("zookeeper: %w: %w", fenced.ErrUnavailable, context.Cause(ctx))
		}
		t.Stop()
	}
}

// errTTLTooLong is the one refusal of a TTL longer than limit, the longest
// TTL the session in use covers (maxTTLFor).
func errTTLTooLong(ttl, limit time.Duration) error {
	return fmt.Errorf("%w: TTL %v exceeds %v, the longest a session covers here (session timeout*7/8 - tickTime; see Sessions)",
		fenced.ErrInvalidTTL, ttl, limit)
}
