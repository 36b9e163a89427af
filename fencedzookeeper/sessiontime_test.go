package fencedzookeeper

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/backend/sessionlock"
)

// TestSessionTimeoutCoversTTL checks the session sizing of issue 9 item 13:
// the session a TTL gets covers it (maxTTLFor inverts sessionTimeoutFor)
// and leaves a tick plus two keep-alive periods of headroom; and the
// figures the package documentation quotes.
func TestSessionTimeoutCoversTTL(t *testing.T) {
	for _, tick := range []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 2 * time.Second, 3 * time.Second} {
		for _, ttl := range []time.Duration{10 * time.Millisecond, 500 * time.Millisecond, 999 * time.Millisecond, 10 * time.Second, 30 * time.Second, time.Hour} {
			s := sessionTimeoutFor(ttl, tick)
			if s%time.Millisecond != 0 {
				t.Errorf("sessionTimeoutFor(%v, %v) = %v, not whole milliseconds", ttl, tick, s)
			}
			if maxTTLFor(s, tick) < ttl {
				t.Errorf("a %v session (for TTL %v, tick %v) covers only %v", s, ttl, tick, maxTTLFor(s, tick))
			}
			if s-ttl < tick+2*keepaliveEvery(s) {
				t.Errorf("a %v session for TTL %v leaves %v of headroom, want at least a tick (%v) and two keep-alive periods (%v)", s, ttl, s-ttl, tick, 2*keepaliveEvery(s))
			}
			if s > sessionTimeoutFor(ttl+time.Millisecond, tick) {
				t.Errorf("sessionTimeoutFor is not monotonic at TTL %v", ttl)
			}
		}
	}
	if got := sessionTimeoutFor(30*time.Second, 2*time.Second); got.Round(100*time.Millisecond) != 36600*time.Millisecond {
		t.Errorf("session for TTL 30s, tick 2s: %v, the docs say 36.6s", got)
	}
	if got := maxTTLFor(40*time.Second, 2*time.Second); got != 33*time.Second {
		t.Errorf("longest TTL of a 40s session, tick 2s: %v, the docs say 33s", got)
	}
}

// TestKnownActivity checks which recorded keep-alives count as heard of by
// the leader: a request a tick after its answer, the session's creation at
// once, and only those of the session asked about.
func TestKnownActivity(t *testing.T) {
	const tick = 100 * time.Millisecond
	zc := newZSession(nil, 10*time.Second)
	t0 := time.Now()
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	zc.record(activity{session: 7, sent: at(0), done: at(5 * time.Millisecond), atLeader: true})
	zc.record(activity{session: 7, sent: at(300 * time.Millisecond), done: at(310 * time.Millisecond)})
	zc.record(activity{session: 8, sent: at(500 * time.Millisecond), done: at(501 * time.Millisecond)})
	for _, c := range []struct {
		session  int64
		at, want time.Duration
		ok       bool
		next     time.Duration
	}{
		{7, 0, 0, false, 5 * time.Millisecond},
		{7, 5 * time.Millisecond, 0, true, 410 * time.Millisecond},
		{7, 409 * time.Millisecond, 0, true, 410 * time.Millisecond},
		{7, 410 * time.Millisecond, 300 * time.Millisecond, true, 0},
		{8, 600 * time.Millisecond, 0, false, 601 * time.Millisecond},
		{8, 601 * time.Millisecond, 500 * time.Millisecond, true, 0},
		{9, time.Second, 0, false, 0},
	} {
		latest, ok, next, _ := zc.known(c.session, at(c.at), tick)
		if ok != c.ok || ok && !latest.Equal(at(c.want)) || c.next == 0 && !next.IsZero() || c.next != 0 && !next.Equal(at(c.next)) {
			t.Errorf("known(session %d, at %v) = %v, %v, next %v; want %v, %v, next %v",
				c.session, c.at, latest.Sub(t0), ok, next.Sub(t0), c.want, c.ok, c.next)
		}
	}
	// Entries sent more than a session timeout before the newest answer go.
	zc.record(activity{session: 7, sent: at(20 * time.Second), done: at(20 * time.Second)})
	if len(zc.acts) != 1 {
		t.Errorf("record kept %d stale entries", len(zc.acts)-1)
	}
}

// TestAwaitHeadroom checks that a grant proceeds at once when a reported
// keep-alive covers it, waits for one answered just now to be reported (a
// tick), and is refused as unavailable, without waiting past the TTL,
// when no answered request is recent enough.
func TestAwaitHeadroom(t *testing.T) {
	const tick = 50 * time.Millisecond
	d := &Driver{tick: tick}
	session := func() int64 { return 7 }
	ctx := context.Background()
	const ttl = 100 * time.Millisecond
	zc := newZSession(nil, sessionTimeoutFor(ttl, tick))
	now := time.Now()
	reported := now.Add(-tick - 5*time.Millisecond)
	zc.record(activity{session: 7, sent: reported, done: reported})
	if err := d.awaitHeadroomOf(ctx, zc, session, now, ttl); err != nil {
		t.Fatalf("with a reported keep-alive: %v", err)
	}

	zc = newZSession(nil, sessionTimeoutFor(ttl, tick))
	now = time.Now()
	zc.record(activity{session: 7, sent: now, done: now})
	if err := d.awaitHeadroomOf(ctx, zc, session, now, ttl); err != nil {
		t.Fatalf("with a keep-alive answered just now: %v", err)
	}
	if waited := time.Since(now); waited < tick {
		t.Fatalf("went ahead after %v, before the keep-alive could have been reported (a tick, %v)", waited, tick)
	}

	zc = newZSession(nil, sessionTimeoutFor(ttl, tick))
	old := time.Now().Add(-time.Second)
	zc.record(activity{session: 7, sent: old, done: old, atLeader: true})
	err := d.awaitHeadroomOf(ctx, zc, session, time.Now(), ttl)
	if !errors.Is(err, fenced.ErrUnavailable) {
		t.Fatalf("with only an old keep-alive: %v, want ErrUnavailable", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := d.awaitHeadroomOf(cctx, zc, session, time.Now(), ttl); !errors.Is(err, context.Canceled) {
		t.Fatalf("with ctx cancelled: %v, want context.Canceled", err)
	}
}

// TestAwaitHeadroomWaitsForLateAnswer checks that a grant waits for a
// keep-alive answered late, after the last moment a keep-alive sent before
// the acquisition could still cover it (start + session timeout - TTL),
// rather than giving up as unavailable (issue 38). A keep-alive sent after
// the acquisition began covers the grant, since the session timeout exceeds
// the TTL. The answer's times are set ahead, so that when it counts does
// not depend on the machine's speed: sent 400 ms after the start, answered
// at 500 ms, heard of by the leader a tick later, well within the TTL.
func TestAwaitHeadroomWaitsForLateAnswer(t *testing.T) {
	const tick = 100 * time.Millisecond
	const ttl = time.Second
	d := &Driver{tick: tick}
	session := func() int64 { return 7 }
	zc := newZSession(nil, sessionTimeoutFor(ttl, tick))
	start := time.Now()
	old := start.Add(-time.Second)
	zc.record(activity{session: 7, sent: old, done: old, atLeader: true})
	late := activity{session: 7, sent: start.Add(400 * time.Millisecond), done: start.Add(500 * time.Millisecond)}
	zc.record(late)
	if err := d.awaitHeadroomOf(context.Background(), zc, session, start, ttl); err != nil {
		t.Fatalf("with a keep-alive answered %v after the start (the old give-up was at %v): %v",
			late.done.Sub(start), zc.timeout-ttl, err)
	}
	if waited := time.Since(start); waited < late.done.Sub(start)+tick {
		t.Fatalf("went ahead after %v, before the late keep-alive could have been reported (%v)", waited, late.done.Sub(start)+tick)
	}
}

// TestLeaderProof checks when a waiter's look may stand on a recent write
// of its session instead of a sync: only a write of that session, sent no
// earlier than the acquisition began and at most writeProofAge before the
// look, at whose sending the session had headroom for the whole TTL from
// it (a keep-alive answered a tick before, recent enough).
func TestLeaderProof(t *testing.T) {
	const (
		tick = 100 * time.Millisecond
		ttl  = 10 * time.Second
	)
	d := &Driver{tick: tick}
	timeout := sessionTimeoutFor(ttl, tick)
	t0 := time.Now()
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	newSession := func() *zsession {
		zc := newZSession(nil, timeout)
		// A keep-alive answered at 10ms: it counts from 110ms.
		zc.record(activity{session: 7, sent: at(0), done: at(10 * time.Millisecond)})
		return zc
	}
	for _, c := range []struct {
		name            string
		write           *activity
		notBefore, look time.Duration
		ok              bool
	}{
		{name: "no write", look: 200 * time.Millisecond},
		{name: "write of the session", write: &activity{session: 7, sent: at(150 * time.Millisecond)}, look: 160 * time.Millisecond, ok: true},
		{name: "write of another session", write: &activity{session: 8, sent: at(150 * time.Millisecond)}, look: 160 * time.Millisecond},
		{name: "write before the acquisition", write: &activity{session: 7, sent: at(150 * time.Millisecond)}, notBefore: 151 * time.Millisecond, look: 160 * time.Millisecond},
		{name: "write too old", write: &activity{session: 7, sent: at(150 * time.Millisecond)}, look: 150*time.Millisecond + writeProofAge(ttl) + time.Millisecond},
		{name: "write as old as allowed", write: &activity{session: 7, sent: at(150 * time.Millisecond)}, look: 150*time.Millisecond + writeProofAge(ttl), ok: true},
		// The keep-alive was answered less than a tick before the write:
		// the leader may not have heard of it when the write passed.
		{name: "no keep-alive heard of", write: &activity{session: 7, sent: at(50 * time.Millisecond)}, look: 60 * time.Millisecond},
		// The keep-alive is too old to cover a TTL from the write.
		{name: "no headroom", write: &activity{session: 7, sent: at(timeout - ttl + time.Millisecond)}, look: timeout - ttl + 2*time.Millisecond},
	} {
		zc := newSession()
		if c.write != nil {
			zc.lastWrite = *c.write
		}
		got, ok := d.leaderProof(zc, 7, at(c.notBefore), at(c.look), ttl)
		if ok != c.ok || ok && !got.Equal(c.write.sent) {
			t.Errorf("%s: leaderProof = %v, %v; want ok %v (the write's sending)", c.name, got, ok, c.ok)
		}
	}
}

// TestLateGrantKeptForReask checks that a grant confirmed after its own
// validity ran out (from+ttl in the past) is not ended at once: its owner
// is told it came too late and asks again as the same owner, and that
// request must find it still tracked (issue 38: "the grant ended as it was
// confirmed").
func TestLateGrantKeptForReask(t *testing.T) {
	d := &Driver{}
	ended := make(chan struct{}, 1)
	d.grants = sessionlock.NewGrants(func(*entry) error { ended <- struct{}{}; return nil }, nil)
	t.Cleanup(d.grants.Close)
	const ttl = time.Second
	e := &entry{id: sessionlock.ID{Key: "k", Owner: "o"}, czxid: 1}
	if _, err := d.grant(e, ttl, time.Now().Add(-2*ttl)); err != nil {
		t.Fatalf("late grant: %v", err)
	}
	// The reaper, were the deadline past, would end the entry at once.
	time.Sleep(50 * time.Millisecond)
	if d.grants.Lookup("k", "o") != e {
		t.Fatal("a grant confirmed past its validity was ended at once: its owner's request again finds it gone")
	}
	if _, err := d.grant(e, ttl, time.Now()); err != nil {
		t.Fatalf("the owner's request again: %v", err)
	}
	select {
	case <-ended:
		t.Fatal("ended although its owner confirmed it again")
	default:
	}
}
