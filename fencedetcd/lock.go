package fencedetcd

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/backend/sessionlock"
	"github.com/fenced-dev/fenced/internal/core/ttlrule"
)

// waiterKey is the key a session puts under lock name, exactly as etcd's
// concurrency.Mutex names it. A session holds one key per lock name at a
// time (see session.names). A name is reused on a session only once the
// driver has forgotten the grant that had it. A key name that never changes
// keeps etcd's index of the lock's keys at one entry per session. A new name
// per grant would grow it by one entry per grant until the next compaction,
// and every look at the lock's line scans it.
func waiterKey(name string, s *session) string {
	// Base 16 as the Mutex's %x of the lease ID, a sign included.
	return name + "/" + strconv.FormatInt(int64(s.id), 16)
}

// TryAcquire implements driver.Driver. It puts the waiter key only if no key
// exists under the lock name (one transaction), so it never queues. A
// repeated call by the holding owner returns the same fence.
func (d *Driver) TryAcquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	start := time.Now()
	name := d.LockName(key)
	pfx := name + "/"
	if e := d.grants.Lookup(key, owner); e != nil {
		// Our own earlier grant (or an attempt whose outcome was unknown).
		return d.confirm(ctx, e, ttl, start)
	}
	s, err := d.reserve(ctx, ttl, name)
	if err != nil {
		return 0, err
	}
	e := &entry{id: sessionlock.ID{Key: key, Owner: owner}, etcdKey: waiterKey(name, s), name: name, s: s}
	resp, kaErr, err := d.put(ctx, e, ttl, start, d.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(pfx), "=", 0).WithPrefix()).
		Then(clientv3.OpPut(e.etcdKey, owner, clientv3.WithLease(s.id)), d.recordPut(name)).
		Else(clientv3.OpGet(pfx, clientv3.WithFirstCreate()...)))
	if errors.Is(err, errStartOver) {
		return d.TryAcquire(ctx, key, owner, ttl)
	}
	if err != nil {
		return 0, err
	}
	if !resp.Succeeded {
		d.unreserve(s, name)
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) > 0 && string(kvs[0].Value) == owner {
			return 0, fmt.Errorf("etcd: acquire: %w: owner token already queued through another client", fenced.ErrHeld)
		}
		return 0, &fenced.HeldError{}
	}
	e.rev = resp.Header.Revision
	e.granted = true
	d.grants.Track(e, ttl, start)
	if kaErr != nil {
		return 0, fmt.Errorf("etcd: acquire: key put but the session keep-alive failed: %w", asUnknown(kaErr))
	}
	return uint64(e.rev), nil
}

// errStartOver means an acquisition found its session expired before its
// key was put: nothing was put, and it starts over with a new session.
var errStartOver = errors.New("session expired before the put; start over")

// put commits txn, which puts e's key on its session, and sends a keep-alive
// of the session alongside. If the key is granted at once, the session then
// outlives the lease's local validity (from start) without a second round
// trip. kaErr is the keep-alive's outcome. When the session had expired,
// nothing was put: put drops the session and fails with errStartOver. On any
// other failure the key may have been put, so e is tracked. A retry by the
// same owner finds it, and the reaper deletes it if nobody does.
func (d *Driver) put(ctx context.Context, e *entry, ttl time.Duration, start time.Time,
	txn clientv3.Txn) (resp *clientv3.TxnResponse, kaErr, err error) {
	kaDone := d.keepAliveAsync(ctx, e.s, start, ttl)
	resp, err = txn.Commit()
	kaErr = <-kaDone
	if err == nil {
		return resp, kaErr, nil
	}
	werr := writeErr("acquire", err)
	// However long the request took (a process stopped while it waited
	// for the reply), a put on an expired lease did nothing: etcd refuses
	// it, or deleted it with the lease.
	if errors.Is(werr, errSessionGone) {
		d.markDead(e.s)
		return nil, kaErr, fmt.Errorf("%w: %w", errStartOver, werr)
	}
	d.grants.Track(e, ttl, start)
	return nil, kaErr, werr
}

func asUnknown(err error) error {
	if errors.Is(err, fenced.ErrUnavailable) || errors.Is(err, errSessionGone) {
		return fmt.Errorf("%w: %v", fenced.ErrUnknownOutcome, err)
	}
	return err
}

// confirm checks that e's key still exists as the lowest under its lock
// name and extends its session; it serves re-acquisition by the same owner.
func (d *Driver) confirm(ctx context.Context, e *entry, ttl time.Duration, start time.Time) (uint64, error) {
	pfx := e.name + "/"
	kaDone := d.keepAliveAsync(ctx, e.s, start, ttl)
	resp, err := d.cli.Txn(ctx).Then(
		clientv3.OpGet(e.etcdKey),
		clientv3.OpGet(pfx, clientv3.WithFirstCreate()...),
	).Commit()
	kaErr := <-kaDone
	if err != nil {
		return 0, readErr("acquire", err)
	}
	mine := resp.Responses[0].GetResponseRange().Kvs
	first := resp.Responses[1].GetResponseRange().Kvs
	if len(mine) == 0 || string(mine[0].Value) != e.id.Owner && !(e.proclaimed.Load() && mine[0].CreateRevision == e.rev) {
		d.grants.Forget(e)
		// Our earlier attempt left nothing: try afresh.
		return d.TryAcquire(ctx, e.id.Key, e.id.Owner, ttl)
	}
	if len(first) == 0 || first[0].CreateRevision != mine[0].CreateRevision {
		if !e.granted {
			d.grants.EndNow(e) // TryAcquire never leaves a key queued
		}
		return 0, &fenced.HeldError{}
	}
	if kaErr != nil {
		return 0, asUnknown(kaErr)
	}
	e.rev = mine[0].CreateRevision
	f, err := d.grant(e, ttl, start)
	if err != nil {
		// Ended by the reaper as we confirmed it: try afresh.
		return d.TryAcquire(ctx, e.id.Key, e.id.Owner, ttl)
	}
	return f, nil
}

// AcquireTimed implements driver.TimedQueuer with etcd's recipe: put a
// waiter key, then wait for the deletion of the key created just before it,
// until none is left. The session is kept alive while waiting. Each look at
// the queue goes out with a keep-alive, so the grant is confirmed (and its
// validity starts) when the last look was sent. When ctx ends the waiter
// key is deleted.
func (d *Driver) AcquireTimed(ctx context.Context, key, owner string, ttl time.Duration) (uint64, time.Time, error) {
	start := time.Now()
	name := d.LockName(key)
	pfx := name + "/"
	s, err := d.reserve(ctx, ttl, name)
	if err != nil {
		return 0, time.Time{}, err
	}
	e := &entry{id: sessionlock.ID{Key: key, Owner: owner}, etcdKey: waiterKey(name, s), name: name, s: s}
	fail := func(err error) (uint64, time.Time, error) {
		d.grants.EndNow(e)
		if ctx.Err() != nil {
			return 0, time.Time{}, context.Cause(ctx)
		}
		return 0, time.Time{}, err
	}
	resp, kaErr, err := d.put(ctx, e, ttl, start, d.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(e.etcdKey), "=", 0)).
		Then(clientv3.OpPut(e.etcdKey, owner, clientv3.WithLease(s.id)), clientv3.OpGet(pfx, clientv3.WithFirstCreate()...),
			d.recordPut(name)).
		Else(clientv3.OpGet(e.etcdKey)))
	if errors.Is(err, errStartOver) {
		return d.AcquireTimed(ctx, key, owner, ttl)
	}
	if err != nil {
		return fail(err)
	}
	if !resp.Succeeded {
		d.unreserve(s, name)
		return 0, time.Time{}, fmt.Errorf("etcd: acquire: session %x already has key %s (another process shares the lease)",
			int64(s.id), e.etcdKey)
	}
	e.rev = resp.Header.Revision
	d.grants.Track(e, ttl, start)
	first := resp.Responses[1].GetResponseRange().Kvs
	if len(first) > 0 && first[0].CreateRevision == e.rev && kaErr == nil {
		e.granted = true
		return uint64(e.rev), start, nil
	}
	// Keep the session (and our entry) alive while we wait.
	wctx, stopKA := context.WithCancel(ctx)
	defer stopKA()
	go d.keepWaiting(wctx, e, ttl)
	var sent time.Time   // when the look that found our key oldest was sent
	var confirmErr error // a failed confirmation ends the wait
	step := func(ctx context.Context) (bool, error) {
		sent = time.Now()
		kaDone := d.keepAliveAsync(ctx, s, sent, ttl)
		pred, err := d.predecessor(ctx, e)
		kaErr := <-kaDone
		if err != nil {
			// errVanished ends the wait; otherwise the cluster did not
			// answer (a leader election, a member down): look again.
			return false, err
		}
		if pred == "" {
			stopKA()
			if kaErr != nil {
				// Confirm the session with a keep-alive of its own.
				sent = time.Now()
				if err := d.keepAlive(ctx, s); err != nil {
					confirmErr = err
					return false, err
				}
			}
			return true, nil
		}
		// A broken watch (its member lost the leader, or the connection)
		// is retried: the next look also tells whether our key survived.
		return false, d.waitDelete(ctx, e, pred)
	}
	if err := sessionlock.WaitTurn(ctx, step,
		func(err error) bool { return err != confirmErr && !errors.Is(err, errVanished) }); err != nil {
		return fail(err)
	}
	f, err := d.grant(e, ttl, sent)
	if err != nil {
		return fail(err)
	}
	return f, sent, nil
}

// keepAliveAsync makes sure s outlives from+ttl at the server: it sends a
// keep-alive unless one sent recently already does, and delivers the
// outcome.
func (d *Driver) keepAliveAsync(ctx context.Context, s *session, from time.Time, ttl time.Duration) <-chan error {
	ch := make(chan error, 1)
	if d.covers(s, from, ttl) {
		ch <- nil
		return ch
	}
	go func() { ch <- d.keepAlive(ctx, s) }()
	return ch
}

// errVanished means a waiter's key disappeared while it waited.
var errVanished = errors.New("our waiter key vanished while waiting")

// predecessor returns the key created just before e's under its lock name
// ("" when e's key is the oldest). It fails with errVanished if e's key is
// gone (session expired, or broken).
func (d *Driver) predecessor(ctx context.Context, e *entry) (string, error) {
	resp, err := d.cli.Txn(ctx).Then(
		clientv3.OpGet(e.etcdKey),
		clientv3.OpGet(e.name+"/", append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(e.rev-1))...),
	).Commit()
	if err != nil {
		return "", readErr("wait for predecessor", err)
	}
	mine := resp.Responses[0].GetResponseRange().Kvs
	if len(mine) == 0 || mine[0].CreateRevision != e.rev {
		return "", fmt.Errorf("etcd: acquire: %w: %w: %s (session expired or broken)", fenced.ErrUnavailable, errVanished, e.etcdKey)
	}
	pred := resp.Responses[1].GetResponseRange().Kvs
	if len(pred) == 0 {
		return "", nil
	}
	return string(pred[0].Key), nil
}

// waitDelete waits until key, which e read as its predecessor, is gone.
//
// The watch starts at the store's current revision (no WithRev), never at
// an older one. etcd puts a watch that starts at a past revision in its
// "unsynced" group, which delivers events only on its sync tick (every
// 100 ms). A release, or any write to the store, between our read and the
// watch's registration would then delay the wake-up by up to 100 ms. A
// watch from the current revision is "synced": it is told of a delete as
// it commits.
//
// Such a watch does not replay what happened before it was registered. So
// once the server confirms the watch, one linearizable read asks whether
// the predecessor is still there. If it is, its delete lies ahead and the
// watch will see it. If it is gone (or was recreated after e, so it no
// longer precedes e), the caller looks at the queue again.
func (d *Driver) waitDelete(ctx context.Context, e *entry, key string) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := d.cli.Watch(wctx, key, clientv3.WithFilterPut(), clientv3.WithCreatedNotify())
	created := false
	for wr := range wch {
		if err := wr.Err(); err != nil {
			return readErr("watch predecessor", err)
		}
		if !created && wr.Created {
			created = true
			resp, err := d.cli.Get(ctx, key)
			if err != nil {
				return readErr("watch predecessor", err)
			}
			if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision >= e.rev {
				return nil
			}
		}
		for _, ev := range wr.Events {
			if ev.Type == mvccpb.DELETE {
				return nil
			}
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("etcd: watch predecessor %s: %w: watch closed", key, fenced.ErrUnavailable)
}

// keepWaiting keeps e's session and entry alive until ctx ends.
func (d *Driver) keepWaiting(ctx context.Context, e *entry, ttl time.Duration) {
	period := max(time.Duration(e.s.ttl)*time.Second/3, 100*time.Millisecond)
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			sent := time.Now()
			if err := d.keepAlive(ctx, e.s); err == nil && !d.grants.Extend(e, ttl, sent) {
				return // ended: the wait finds out at its next look
			}
		}
	}
}

// Renew implements driver.Driver. It confirms that g's key still exists and
// sends a keep-alive for its session. That keeps the grant for g.TTL: the
// session's TTL, chosen at the grant, covers it.
func (d *Driver) Renew(ctx context.Context, g driver.Grant) error {
	errs, err := d.RenewBatch(ctx, []driver.Grant{g})
	if err != nil {
		return err
	}
	return errs[0]
}

// maxReadsPerTxn is how many key reads one renewal transaction carries.
// etcd refuses a transaction with more operations than its --max-txn-ops
// (128 by default) as a whole, so a larger batch is split into
// transactions of this size.
const maxReadsPerTxn = 128

// renewReadsInFlight bounds the read transactions one RenewBatch has in
// flight at once, so a large batch does not flood the server.
const renewReadsInFlight = 4

// RenewBatch implements driver.BatchRenewer. It sends one keep-alive per
// session (none when a recent one covers the TTL). Concurrently it reads
// the keys in transactions of at most maxReadsPerTxn reads. A session that
// carries more of the batch's grants than that gets one LeaseTimeToLive
// listing its keys instead. A grant is renewed only when its key still
// holds its revision and its session's keep-alive was answered. A read
// transaction
// that fails fails only its own grants (with the read's error, never
// ErrNotHeld). The batch fails as a whole only when every read failed.
func (d *Driver) RenewBatch(ctx context.Context, grants []driver.Grant) ([]error, error) {
	if err := ttlrule.CheckAll(grants); err != nil {
		return nil, err
	}
	r := newBatchRenewal(d, grants)
	if len(r.idx) == 0 {
		return r.errs, nil
	}
	r.keepAlive(ctx)
	r.readKeys(ctx, r.listSessions(ctx))
	r.wg.Wait()
	if d.renewHook != nil {
		d.renewHook()
	}
	if int(r.failed.Load()) == len(r.idx) {
		return nil, r.readErrs[0]
	}
	r.settle()
	return r.errs, nil
}

// listingReuse is how long a listing of a session's keys (see
// attachedKeys) is kept after it was made. It serves the RenewBatch calls
// that began before its request was sent. A client renews its leases in
// calls of a few thousand grants, a few at a time. One listing serves them
// all; otherwise each would fetch every key of the session. A call that
// began after the listing was sent makes a listing of its own. So no
// renewal reports held a key that was deleted after its listing was taken.
const listingReuse = time.Second

// keyListing is one LeaseTimeToLive listing of a session's keys, shared by
// the RenewBatch calls that need it.
type keyListing struct {
	sent time.Time
	done chan struct{} // closed once keys or err is set
	keys map[string]bool
	err  error
}

// attachedKeys returns the keys attached to s's etcd lease, from a
// listing whose request was sent no earlier than notBefore: one in flight
// or just made if there is one, else a new one.
func (d *Driver) attachedKeys(ctx context.Context, s *session, notBefore time.Time) (keys map[string]bool, err error) {
	d.mu.Lock()
	if kl := s.listing; kl != nil && !kl.sent.Before(notBefore) {
		d.mu.Unlock()
		select {
		case <-kl.done:
		case <-ctx.Done():
			return nil, readErr("renew", ctx.Err())
		}
		if kl.err == nil {
			return kl.keys, nil
		}
		// The request that made it failed (perhaps only its caller's
		// context ended): make one of our own.
		d.mu.Lock()
	}
	kl := &keyListing{sent: time.Now(), done: make(chan struct{})}
	s.listing = kl
	d.mu.Unlock()
	resp, err := d.cli.TimeToLive(ctx, s.id, clientv3.WithAttachedKeys())
	if err != nil {
		kl.err = readErr("renew", err)
	} else {
		kl.keys = make(map[string]bool, len(resp.Keys))
		for _, k := range resp.Keys {
			kl.keys[string(k)] = true
		}
	}
	close(kl.done)
	// Do not keep a large listing past its use.
	time.AfterFunc(listingReuse, func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		if s.listing == kl {
			s.listing = nil
		}
	})
	return kl.keys, kl.err
}

// Release implements driver.Driver. It deletes g's key and never any
// other: not a key of the same name that a later grant put on the same
// session once the driver had forgotten g (key names are reused, see
// waiterKey). A key already gone (broken, reaped, or its session expired)
// fails with ErrNotHeld.
//
// A grant the driver tracks is released with a plain delete of its key,
// as etcd's Mutex unlocks (see releaseTracked). Any other grant is
// released by a transaction that compares the key's create revision with
// g's fence, and its value with g's owner token (unless a leader's value
// replaced it).
//
// Some grants the driver does not track as granted: the acquisition's
// outcome was unknown, or it gave up as it was granted and the driver ended
// or forgot it. Such a grant is found as the lock's oldest key. It is
// released if that key carries g's owner token and fence. The client
// releases such a grant by owner once its caller has gone.
func (d *Driver) Release(ctx context.Context, g driver.Grant) error {
	// Built only when needed: a release is a hot path.
	notHeld := func() error { return fmt.Errorf("etcd: release %s: %w", g, fenced.ErrNotHeld) }
	if g.Fence == 0 || g.Owner == "" {
		return notHeld()
	}
	e := d.grants.Lookup(g.Key, g.Owner)
	var key string
	byOwner := true
	switch {
	case e != nil && uint64(e.rev) == g.Fence && d.pinName(e):
		return d.releaseTracked(ctx, e, notHeld)
	case e != nil && uint64(e.rev) == g.Fence:
		// Forgotten as we looked: only a comparison tells its key.
		key, byOwner = e.etcdKey, !e.proclaimed.Load()
	case e != nil && (e.granted || e.rev != 0):
		return notHeld() // another grant of the same owner
	default:
		resp, err := d.cli.Get(ctx, d.LockName(g.Key)+"/", clientv3.WithFirstCreate()...)
		if err != nil {
			return readErr("release", err)
		}
		if len(resp.Kvs) == 0 || uint64(resp.Kvs[0].CreateRevision) != g.Fence || string(resp.Kvs[0].Value) != g.Owner {
			return notHeld()
		}
		key = string(resp.Kvs[0].Key)
	}
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", int64(g.Fence))}
	if byOwner {
		cmps = append(cmps, clientv3.Compare(clientv3.Value(key), "=", g.Owner))
	}
	resp, err := d.cli.Txn(ctx).If(cmps...).Then(clientv3.OpDelete(key)).Commit()
	if err != nil {
		return writeErr("release", err)
	}
	if e != nil && (resp.Succeeded || e.granted) {
		d.grants.Forget(e)
	}
	if !resp.Succeeded {
		return notHeld()
	}
	return nil
}

// releaseTracked releases e, whose name the caller pinned (pinName), with
// a plain delete of its key, the cheapest write etcd has. A transaction
// costs the server much more than a delete: at 64 concurrent
// acquire+release loops on etcd 3.4 a transactional release, even one
// without a comparison, cost the server about 90 µs more per cycle than a
// delete, a third of its work. (3.4 reads for every transaction through a
// fresh copy of its buffer of uncommitted writes; see docs/design-notes.md.)
//
// No comparison is needed: while the name is pinned no grant of this
// driver can put a key of that name on e's session, and no one else puts
// keys on it (the name carries the session's lease ID, which only this
// driver uses). So the key deleted is e's, or none. The deleted key comes
// back (WithPrevKV), which proves it: should a key of e's name carry
// another create revision (a client that put keys on this driver's lease
// by hand), the release reports that it deleted it.
func (d *Driver) releaseTracked(ctx context.Context, e *entry, notHeld func() error) error {
	defer d.unpinName(e)
	if d.releaseHook != nil {
		d.releaseHook(e)
	}
	resp, err := d.cli.Delete(ctx, e.etcdKey, clientv3.WithPrevKV())
	if err != nil {
		return writeErr("release", err)
	}
	mine := len(resp.PrevKvs) == 1 && resp.PrevKvs[0].CreateRevision == e.rev
	if mine || e.granted {
		d.grants.Forget(e)
	}
	switch {
	case mine:
		return nil
	case len(resp.PrevKvs) > 0:
		// Another client put a key on this driver's etcd lease by hand.
		return fmt.Errorf("%w; key %s was gone; deleted instead: another client's key of that name, put at revision %d",
			notHeld(), e.etcdKey, resp.PrevKvs[0].CreateRevision)
	default:
		return notHeld()
	}
}

// WatchLoss implements driver.LossWatcher. It watches g's key from its
// creation on and reports ErrLost when the key is deleted by anyone but
// this driver's release (an admin break, or the session expiring). Every
// watch of the driver shares one Watch stream and no goroutine (see
// lossWatches).
func (d *Driver) WatchLoss(g driver.Grant, lost func(error)) (func(), error) {
	e := d.grants.Lookup(g.Key, g.Owner)
	if e == nil || !e.granted || uint64(e.rev) != g.Fence {
		return nil, fmt.Errorf("etcd: watch %s: %w", g, fenced.ErrNotHeld)
	}
	return d.losses.add(e, sessionlock.NewLoss(lost)), nil
}
