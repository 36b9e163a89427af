package fencedzookeeper

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fenced-dev/fenced/fencedzookeeper/internal/zk"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/backend/sessionlock"
)

// TryAcquire implements driver.Driver: create a node, and delete it again
// unless it is the lowest.
func (d *Driver) TryAcquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	start := time.Now()
	if e := d.grants.Lookup(key, owner); e != nil {
		return d.confirm(ctx, e, ttl, start)
	}
	e, err := d.newEntry(ctx, key, owner, ttl)
	if err != nil {
		return 0, err
	}
	// The create goes through the leader: it proves, like a sync, that the
	// session's follower reaches the leader after start.
	if err := d.awaitHeadroom(ctx, e.zc, start, ttl); err != nil {
		return 0, err
	}
	r, err := d.createNode(ctx, e)
	if err != nil {
		if errors.Is(err, fenced.ErrUnknownOutcome) {
			d.grants.Track(e, ttl, start) // a retry finds it; else the reaper deletes it
		}
		return 0, err
	}
	l, err := d.lineAfter(e, r, true)
	if err != nil || !l.first() {
		d.grants.EndNow(e)
		switch {
		case err != nil:
			return 0, err
		case !l.present:
			return 0, fmt.Errorf("zookeeper: acquire: %w: our lock node %s vanished (session expired)", fenced.ErrUnavailable, e.path)
		}
		return 0, &fenced.HeldError{}
	}
	return d.grant(e, ttl, start)
}

// syncLeader waits for headroom for a grant of ttl valid from start (see
// awaitHeadroom), then syncs e's session with the leader. The session's
// later reads reflect all the leader had committed when the sync was sent.
// The sync's answer proves that the follower serving the session reached
// the leader after start.
func (d *Driver) syncLeader(ctx context.Context, e *entry, start time.Time, ttl time.Duration) error {
	if err := d.awaitHeadroom(ctx, e.zc, start, ttl); err != nil {
		return err
	}
	if _, err := e.zc.conn.Sync(e.lockPath); err != nil && !errors.Is(err, zk.ErrNoNode) {
		return readErr("sync", err)
	}
	return nil
}

// confirm serves a repeated TryAcquire by the owner of e.
func (d *Driver) confirm(ctx context.Context, e *entry, ttl time.Duration, start time.Time) (uint64, error) {
	if err := d.syncLeader(ctx, e, start, ttl); err != nil {
		return 0, err
	}
	if e.path == "" || e.czxid == 0 {
		p, err := d.findProtected(e)
		if err != nil {
			return 0, readErr("find lock node", err)
		}
		if p == "" {
			d.grants.Forget(e)
			return d.TryAcquire(ctx, e.id.Key, e.id.Owner, ttl)
		}
		ok, stat, err := e.zc.conn.Exists(p)
		if err != nil || !ok {
			return 0, readErr("stat lock node", fmt.Errorf("%s: exists=%v: %v", p, ok, err))
		}
		if !e.adoptNode(p, stat) {
			// Made by a session that has ended since; the server deletes it.
			d.grants.Forget(e)
			return d.TryAcquire(ctx, e.id.Key, e.id.Owner, ttl)
		}
	}
	l, err := d.lookLine(e, nil, true)
	if err != nil {
		return 0, err
	}
	if !l.present {
		d.grants.Forget(e)
		return d.TryAcquire(ctx, e.id.Key, e.id.Owner, ttl)
	}
	if !l.first() {
		return 0, &fenced.HeldError{}
	}
	return d.grant(e, ttl, start)
}

// AcquireTimed implements driver.TimedQueuer: create a node, then wait for
// the deletion of the youngest node ahead of it until none is left.
//
// The first look is the listing sent right behind the create (see create),
// as in TryAcquire. The create reaches the leader, and validity starts
// before it, once the session has headroom (awaitHeadroom).
//
// Each later look is a sync with the leader followed by a listing. So the
// grant is confirmed by a listing that reflects the leader's state when the
// sync was sent, with our node (so our session) still there. The lease's
// validity then starts before that sync, once the session has headroom for
// it.
//
// A write of the session answered lately does what the sync would
// (leaderProof). A look is then a listing alone. Validity starts when that
// write was sent, no earlier than the call and at most writeProofAge before
// the look.
func (d *Driver) AcquireTimed(ctx context.Context, key, owner string, ttl time.Duration) (uint64, time.Time, error) {
	start := time.Now()
	e, err := d.newEntry(ctx, key, owner, ttl)
	if err != nil {
		return 0, time.Time{}, err
	}
	// As in TryAcquire, the create reaches the leader after start, so the
	// first look needs no sync: the listing that follows the create's
	// answer reflects every older node still there, and a grant from it is
	// valid from start.
	checked := e.zc.conn.SessionID()
	if err := d.awaitHeadroom(ctx, e.zc, start, ttl); err != nil {
		return 0, time.Time{}, err
	}
	if e.zc.conn.SessionID() != checked {
		checked = 0 // a new session meanwhile: which one had headroom is unknown
	}
	r, err := d.createNode(ctx, e)
	if err != nil {
		if errors.Is(err, fenced.ErrUnknownOutcome) {
			d.grants.EndNow(e)
		}
		return 0, time.Time{}, err
	}
	d.grants.Track(e, max(ttl, time.Hour), start) // waiting: the session keeps the node
	fail := func(err error) (uint64, time.Time, error) {
		d.grants.EndNow(e)
		if ctx.Err() != nil {
			return 0, time.Time{}, context.Cause(ctx)
		}
		return 0, time.Time{}, err
	}
	var sent time.Time // when the look that found our node oldest was sent
	var prev *line     // the last look at the line, once there is one
	var finalErr error // ends the wait whatever it is
	// The next look directly follows the create, made on the session whose
	// headroom was checked (else it syncs like the later ones).
	afterCreate := checked != 0 && e.session == checked
	step := func(ctx context.Context) (bool, error) {
		var l line
		var err error
		now := time.Now()
		switch w, proof := d.leaderProof(e.zc, e.session, start, now, ttl); {
		case afterCreate:
			afterCreate = false
			sent = start
			l, err = d.lineAfter(e, r, false)
		case proof:
			// A write of the session (another grant's create or release,
			// most often) reached the leader lately: it serves as the sync.
			sent = w
			l, err = d.lookLine(e, prev, false)
		default:
			sent = now
			if err := d.awaitHeadroom(ctx, e.zc, sent, ttl); err != nil {
				return false, err
			}
			l, err = d.syncLookLine(e, prev)
		}
		if err != nil {
			return false, err
		}
		if l.first() {
			return true, nil
		}
		if !l.present {
			finalErr = fmt.Errorf("zookeeper: %w: our lock node %s vanished (session expired or broken)", fenced.ErrUnavailable, e.path)
			return false, finalErr
		}
		prev = &l
		// Wait for the youngest node ahead of ours: one waiter per node.
		pred := l.predecessor()
		ok, _, ch, err := e.zc.conn.ExistsW(e.lockPath + "/" + pred.name)
		if err != nil || !ok {
			return false, readErrOrNil("watch predecessor", err)
		}
		select {
		case <-ch:
			return false, nil
		case <-e.zc.expiredC():
			finalErr = fmt.Errorf("zookeeper: %w: session expired while waiting", fenced.ErrUnavailable)
			return false, finalErr
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	// A connection loss is followed by another look after a pause: the
	// client reconnects within the session, keeping our node.
	if err := sessionlock.WaitTurn(ctx, step, func(err error) bool { return err != finalErr && transient(err) }); err != nil {
		return fail(err)
	}
	f, err := d.grant(e, ttl, sent)
	if err != nil {
		return fail(err)
	}
	return f, sent, nil
}

// readErrOrNil is readErr for a non-nil err, else nil.
func readErrOrNil(op string, err error) error {
	if err == nil {
		return nil
	}
	return readErr(op, err)
}
