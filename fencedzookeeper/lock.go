package fencedzookeeper

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/fenced-dev/fenced/fencedzookeeper/zk"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/sessionlock"
)

// lockMarker separates the protected prefix from the sequence number in
// lock node names, as in Curator's InterProcessMutex ("lock-").
const lockMarker = "lock-"

// entry tracks one lock node of this driver. Its deadline (kept by the
// driver's reaper) is pushed back by every renewal; once it passes the
// driver deletes the node, so a grant nobody renews ends after its TTL even
// though the process keeps its session alive.
type entry struct {
	sessionlock.Tracking
	id       sessionlock.ID
	zc       *zsession
	nodes    *ownNodes // the driver's, where setNode registers the node
	lockPath string
	uuid     string
	// The node's identity, set together by setNode once known.
	path    string // full node path
	czxid   int64  // the fence
	session int64  // the session that owns the node
	granted bool
}

// GrantID implements sessionlock.Entry.
func (e *entry) GrantID() sessionlock.ID { return e.id }

func (e *entry) protectedPrefix() string { return "_c_" + e.uuid + "-" }

// grant marks e granted, tracks it (or moves its deadline) to from+ttl
// and returns its fence. It fails with ErrNotHeld if e ended meanwhile
// (see sessionlock.Grants.Extend): its node is being deleted, or is gone.
func (d *Driver) grant(e *entry, ttl time.Duration, from time.Time) (uint64, error) {
	e.granted = true
	if !d.grants.Track(e, ttl, from) && !d.grants.Extend(e, ttl, from) {
		return 0, fmt.Errorf("zookeeper: acquire %s: %w: the grant ended as it was confirmed", e.id.Key, driver.ErrNotHeld)
	}
	return uint64(e.czxid), nil
}

// setNode records the identity of e's node. It is the only place that sets
// it, so that no way of finding the node (create, or lookup by protected
// prefix after an unknown outcome) can leave part of it unset.
func (e *entry) setNode(path string, czxid, session int64) {
	e.path, e.czxid, e.session = path, czxid, session
	e.nodes.add(path, czxid)
}

// adoptNode records the node at path, found by its protected prefix, as
// e's node. It refuses (false) a node whose owning session is not the live
// session: that session ended, and the server is deleting its nodes.
func (e *entry) adoptNode(path string, stat *zk.Stat) bool {
	if stat.EphemeralOwner == 0 || stat.EphemeralOwner != e.zc.conn.SessionID() {
		return false
	}
	e.setNode(path, stat.Czxid, stat.EphemeralOwner)
	return true
}

// deleteNode deletes e's node, finding it by its protected prefix when its
// path is unknown. A node already gone is not an error.
func (d *Driver) deleteNode(e *entry) error {
	path := e.path
	if path == "" {
		p, err := d.findProtected(e)
		if err != nil {
			return err
		}
		if p == "" {
			return nil
		}
		path = p
	}
	if err := e.zc.conn.Delete(path, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
		return err
	}
	return nil
}

// findProtected returns the path of e's node found by its protected prefix
// ("" when there is none), the way Curator recovers from a connection loss
// during create.
func (d *Driver) findProtected(e *entry) (string, error) {
	names, _, err := e.zc.conn.Children(e.lockPath)
	if errors.Is(err, zk.ErrNoNode) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	for _, n := range names {
		if strings.HasPrefix(n, e.protectedPrefix()) {
			return e.lockPath + "/" + n, nil
		}
	}
	return "", nil
}

// ensureParents creates the persistent znodes above and including path.
func (d *Driver) ensureParents(conn *zk.Conn, path string) error {
	parts := strings.Split(strings.TrimPrefix(path, "/"), "/")
	cur := ""
	for _, p := range parts {
		cur += "/" + p
		if _, err := conn.Create(cur, nil, 0, d.acl); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return err
		}
	}
	return nil
}

// created is the outcome of a create of an entry's lock node.
type created struct {
	path           string
	czxid, session int64
	// names is the listing of the lock path that followed the create on
	// the connection, when listed: it reflects the create.
	names  []string
	listed bool
	// abandoned is set when ctx ended before the create was answered (err
	// is ctx's error).
	abandoned bool
	err       error
}

// create sends e's create and, right behind it on the connection, a
// listing of e's lock path (zk.Conn.MultiChildren): the server serves the
// listing once the create is applied, so it is the listing that would
// follow the create's answer, one round trip sooner. The create travels in
// one transaction with a write to the lock path's data, whose stat then
// carries the transaction's zxid: the new node's czxid, without another
// round trip. When ctx ends before the create is answered it returns
// ctx's error, and late (if not nil) is called with the outcome once it is
// known.
func (d *Driver) create(ctx context.Context, e *entry, late func(created)) created {
	session, sent := e.zc.conn.SessionID(), time.Now()
	outcome := func(res []zk.MultiResponse, err error) created {
		if err != nil {
			return created{err: err}
		}
		if len(res) != 2 || res[1].Stat == nil {
			return created{err: fmt.Errorf("unexpected multi response %+v", res)}
		}
		e.zc.recordWrite(session, sent)
		// The session that just created the node owns it (taken now: a new
		// connection has no session id until it is established).
		return created{path: res[0].String, czxid: res[1].Stat.Mzxid, session: e.zc.conn.SessionID()}
	}
	var lateOutcome func([]zk.MultiResponse, error)
	if late != nil {
		lateOutcome = func(res []zk.MultiResponse, err error) { late(outcome(res, err)) }
	}
	res, err, names, listErr := e.zc.conn.MultiChildren(ctx, lateOutcome, e.lockPath,
		&zk.CreateRequest{Path: e.lockPath + "/" + e.protectedPrefix() + lockMarker, Data: []byte(e.id.Owner), Acl: d.acl, Flags: zk.FlagEphemeral | zk.FlagSequence},
		&zk.SetDataRequest{Path: e.lockPath, Version: -1})
	if ctxErr := ctx.Err(); err != nil && ctxErr != nil && errors.Is(err, ctxErr) {
		return created{err: err, abandoned: true}
	}
	r := outcome(res, err)
	if r.err == nil && listErr == nil {
		r.names, r.listed = names, true
	}
	return r
}

// recoverCreate finishes a create that failed with r: it makes a missing
// lock path and creates once more, and after a connection loss looks for
// the node by its protected prefix, so a create the server applied is
// used, never orphaned. It ignores ctx, as a create in flight would.
func (d *Driver) recoverCreate(e *entry, r created) created {
	if errors.Is(r.err, zk.ErrNoNode) {
		// The lock path does not exist yet: the transaction failed,
		// nothing was applied. Make the path and create once.
		if err := d.ensureParents(e.zc.conn, e.lockPath); err != nil {
			return created{err: err}
		}
		r = d.create(context.Background(), e, nil)
	}
	err := r.err
	if err != nil && !errors.Is(err, zk.ErrNodeExists) && !errors.Is(err, zk.ErrNoAuth) && !errors.Is(err, zk.ErrSessionExpired) && !errors.Is(err, zk.ErrNoNode) {
		// Connection loss: the create may have been applied.
		found, ferr := d.findProtected(e)
		switch {
		case ferr == nil && found != "":
			ok, stat, serr := e.zc.conn.Exists(found)
			if serr == nil && ok {
				r = created{path: found, czxid: stat.Czxid, session: stat.EphemeralOwner}
			}
		case ferr == nil:
			r.err = fmt.Errorf("%w: %v (no node with our protected prefix was created)", driver.ErrUnavailable, err)
		}
	}
	return r
}

// createNode creates e's ephemeral sequential node and learns its czxid
// (see create), returning the listing that followed the create when there
// is one (see created). A failed create goes through recoverCreate. If
// ctx ends first, the node is deleted as soon as the create returns.
func (d *Driver) createNode(ctx context.Context, e *entry) (created, error) {
	drop := func(r created) {
		if r.err != nil {
			r = d.recoverCreate(e, r)
		}
		if r.err == nil {
			_ = e.zc.conn.Delete(r.path, -1)
		}
	}
	r := d.create(ctx, e, drop)
	if r.abandoned {
		return created{}, context.Cause(ctx)
	}
	if r.err != nil {
		// Rare: on a goroutine of its own, so that ctx still ends the wait.
		ch := make(chan created, 1)
		go func() { ch <- d.recoverCreate(e, r) }()
		select {
		case r = <-ch:
		case <-ctx.Done():
			go func() {
				if r := <-ch; r.err == nil {
					_ = e.zc.conn.Delete(r.path, -1)
				}
			}()
			return created{}, context.Cause(ctx)
		}
	}
	if r.err != nil {
		if errors.Is(r.err, driver.ErrUnavailable) || errors.Is(r.err, zk.ErrSessionExpired) {
			return created{}, fmt.Errorf("zookeeper: create lock node: %w", r.err)
		}
		if errors.Is(r.err, zk.ErrNoAuth) || errors.Is(r.err, zk.ErrNoNode) {
			return created{}, fmt.Errorf("zookeeper: create lock node under %s: %w", e.lockPath, r.err)
		}
		return created{}, writeErr("create lock node", r.err)
	}
	e.setNode(r.path, r.czxid, r.session)
	return r, nil
}

// lineAfter is lookLine for the first look after e's create r: the
// listing that followed the create when there is one, else a new one.
func (d *Driver) lineAfter(e *entry, r created, anyElder bool) (line, error) {
	if r.listed {
		return d.lineFrom(e, r.names, nil, anyElder)
	}
	return d.lookLine(e, nil, anyElder)
}

func (d *Driver) newEntry(ctx context.Context, key, owner string, ttl time.Duration) (*entry, error) {
	zc, err := d.session(ctx, ttl)
	if err != nil {
		return nil, err
	}
	return &entry{id: sessionlock.ID{Key: key, Owner: owner}, zc: zc, nodes: &d.nodes, lockPath: d.lockPath(key), uuid: newUUID()}, nil
}

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
		if errors.Is(err, driver.ErrUnknownOutcome) {
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
			return 0, fmt.Errorf("zookeeper: acquire: %w: our lock node %s vanished (session expired)", driver.ErrUnavailable, e.path)
		}
		return 0, &driver.HeldError{Key: key}
	}
	return d.grant(e, ttl, start)
}

// syncLeader waits for headroom for a grant of ttl valid from start (see
// awaitHeadroom), then syncs e's session with the leader: the session's
// later reads reflect all the leader had committed when the sync was sent,
// and the sync's answer proves that the follower serving the session
// reached the leader after start.
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
		return 0, &driver.HeldError{Key: e.id.Key}
	}
	return d.grant(e, ttl, start)
}

// AcquireTimed implements driver.TimedQueuer: create a node, then wait for
// the deletion of the youngest node ahead of it until none is left. The
// first look is the listing sent right behind the create (see create), as
// in TryAcquire (the
// create reaches the leader; validity from before it, once the session
// has headroom: awaitHeadroom). Each later look is a sync with the leader
// followed by a listing, so the grant is confirmed by a listing that
// reflects the leader's state when the sync was sent, with our node (so
// our session) still there; the lease's validity then starts before that
// sync, once the session has headroom for it. A write of the session
// answered lately does what the sync would (leaderProof): a look then is
// a listing alone, and validity starts when that write was sent, no
// earlier than the call and at most writeProofAge before the look.
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
		if errors.Is(err, driver.ErrUnknownOutcome) {
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
			finalErr = fmt.Errorf("zookeeper: %w: our lock node %s vanished (session expired or broken)", driver.ErrUnavailable, e.path)
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
			finalErr = fmt.Errorf("zookeeper: %w: session expired while waiting", driver.ErrUnavailable)
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

// grantEntry returns the entry for g, or ErrNotHeld.
func (d *Driver) grantEntry(op string, g driver.Grant) (*entry, error) {
	e := d.grants.Lookup(g.Key, g.Owner)
	if e == nil || !e.granted || g.Fence == 0 || uint64(e.czxid) != g.Fence {
		return nil, fmt.Errorf("zookeeper: %s %s: %w", op, g, driver.ErrNotHeld)
	}
	return e, nil
}

// Renew implements driver.Driver: once the session has headroom for
// another g.TTL from now (awaitHeadroom), it syncs with the leader and then
// (not concurrently: the read must see what the sync made visible) reads
// g's node, confirming that it still exists and belongs to the live
// session. The session itself is kept alive by the connection; g.TTL must
// not exceed the longest TTL the session covers.
func (d *Driver) Renew(ctx context.Context, g driver.Grant) error {
	if err := g.CheckTTL(); err != nil {
		return err
	}
	ttl := g.TTL
	start := time.Now()
	e, err := d.grantEntry("renew", g)
	if err != nil {
		return err
	}
	if limit := maxTTLFor(e.zc.timeout, d.tick); ttl > limit {
		return fmt.Errorf("zookeeper: renew %s: %w", g, errTTLTooLong(ttl, limit))
	}
	type result struct {
		ok   bool
		stat *zk.Stat
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		if err := d.syncLeader(ctx, e, start, ttl); err != nil {
			ch <- result{err: err}
			return
		}
		ok, stat, err := e.zc.conn.Exists(e.path)
		if err != nil {
			err = readErr("read lock node", err)
		}
		ch <- result{ok, stat, err}
	}()
	var r result
	select {
	case r = <-ch:
	case <-ctx.Done():
		return fmt.Errorf("zookeeper: renew %s: %w: %w", g, driver.ErrUnavailable, ctx.Err())
	}
	if r.err != nil {
		if errors.Is(r.err, zk.ErrSessionExpired) {
			d.grants.Forget(e)
			return fmt.Errorf("zookeeper: renew %s: %w: session expired", g, driver.ErrNotHeld)
		}
		return r.err // classified by syncLeader or readErr
	}
	if !r.ok || r.stat.Czxid != e.czxid || r.stat.EphemeralOwner != e.session || e.zc.conn.SessionID() != e.session {
		// The grant is over. A node of ours that is still there goes now,
		// so that it cannot hold the key for as long as the session lives.
		d.grants.EndNow(e)
		return fmt.Errorf("zookeeper: renew %s: %w: node %s is gone or belongs to another session", g, driver.ErrNotHeld, e.path)
	}
	if !d.grants.Extend(e, ttl, start) {
		return fmt.Errorf("zookeeper: renew %s: %w: the grant ended during the renewal", g, driver.ErrNotHeld)
	}
	return nil
}

// checksPerMulti bounds the grants one RenewBatch transaction checks (a
// check is about a hundred bytes; the server refuses requests over its
// jute.maxbuffer, 1 MB by default).
const checksPerMulti = 1000

// RenewBatch implements driver.BatchRenewer: per session, once it has
// headroom for the longest TTL renewed on it (awaitHeadroom), one
// transaction of version checks (any version) on the grants' nodes per
// checksPerMulti grants, instead of a sync and a read per grant. The
// transaction goes through the leader, like the sync Renew sends, and
// succeeds only if every node exists there, in the session the grant was
// made on (still the connection's session before and after). A node's
// path carries its entry's random UUID, so a node with that path is the
// grant's own node. When a check fails, the grants whose nodes are gone
// end and the rest are checked again; a failure that names no node falls
// back to Renew for each grant of the transaction.
func (d *Driver) RenewBatch(ctx context.Context, grants []driver.Grant) ([]error, error) {
	if err := driver.CheckTTLs(grants); err != nil {
		return nil, err
	}
	start := time.Now()
	errs := make([]error, len(grants))
	bySession := map[*zsession][]int{}
	longest := map[*zsession]time.Duration{}
	for i, g := range grants {
		e, err := d.grantEntry("renew", g)
		if err != nil {
			errs[i] = err
			continue
		}
		if limit := maxTTLFor(e.zc.timeout, d.tick); g.TTL > limit {
			errs[i] = fmt.Errorf("zookeeper: renew %s: %w", g, errTTLTooLong(g.TTL, limit))
			continue
		}
		bySession[e.zc] = append(bySession[e.zc], i)
		longest[e.zc] = max(longest[e.zc], g.TTL)
	}
	for zc, idx := range bySession {
		if err := d.awaitHeadroom(ctx, zc, start, longest[zc]); err != nil {
			for _, i := range idx {
				errs[i] = fmt.Errorf("zookeeper: renew %s: %w", grants[i], err)
			}
			continue
		}
		for len(idx) > 0 {
			n := min(len(idx), checksPerMulti)
			d.renewChecked(ctx, zc, grants, idx[:n], start, errs)
			idx = idx[n:]
		}
	}
	return errs, nil
}

// renewChecked renews the grants at idx, all on zc, with transactions of
// version checks (see RenewBatch), setting their errs.
func (d *Driver) renewChecked(ctx context.Context, zc *zsession, grants []driver.Grant, idx []int, start time.Time, errs []error) {
	for len(idx) > 0 {
		session := zc.conn.SessionID()
		entries := make([]*entry, 0, len(idx))
		live := idx[:0:0]
		ops := make([]any, 0, len(idx))
		for _, i := range idx {
			e := d.grants.Lookup(grants[i].Key, grants[i].Owner)
			if e == nil || !e.granted || uint64(e.czxid) != grants[i].Fence {
				errs[i] = fmt.Errorf("zookeeper: renew %s: %w", grants[i], driver.ErrNotHeld)
				continue
			}
			if e.session != session {
				d.grants.EndNow(e)
				errs[i] = fmt.Errorf("zookeeper: renew %s: %w: node %s belongs to another session", grants[i], driver.ErrNotHeld, e.path)
				continue
			}
			entries = append(entries, e)
			live = append(live, i)
			ops = append(ops, &zk.CheckVersionRequest{Path: e.path, Version: -1})
		}
		if len(ops) == 0 {
			return
		}
		type result struct {
			res []zk.MultiResponse
			err error
		}
		ch := make(chan result, 1)
		go func() {
			sent := time.Now()
			res, err := zc.conn.Multi(ops...)
			if err == nil {
				zc.recordWrite(session, sent)
			}
			ch <- result{res, err}
		}()
		var r result
		select {
		case r = <-ch:
		case <-ctx.Done():
			for _, i := range live {
				errs[i] = fmt.Errorf("zookeeper: renew %s: %w: %w", grants[i], driver.ErrUnavailable, ctx.Err())
			}
			return
		}
		if r.err == nil && zc.conn.SessionID() == session {
			for j, i := range live {
				if !d.grants.Extend(entries[j], grants[i].TTL, start) {
					errs[i] = fmt.Errorf("zookeeper: renew %s: %w: the grant ended during the renewal", grants[i], driver.ErrNotHeld)
				}
			}
			return
		}
		var retry []int
		switch {
		case r.err == nil, errors.Is(r.err, zk.ErrSessionExpired):
			// The session changed or ended: none of these grants is held.
			for j, i := range live {
				d.grants.Forget(entries[j])
				errs[i] = fmt.Errorf("zookeeper: renew %s: %w: session expired", grants[i], driver.ErrNotHeld)
			}
		case errors.Is(r.err, zk.ErrNoNode) && len(r.res) == len(live):
			gone := 0
			for j, i := range live {
				if errors.Is(r.res[j].Error, zk.ErrNoNode) {
					gone++
					d.grants.EndNow(entries[j])
					errs[i] = fmt.Errorf("zookeeper: renew %s: %w: node %s is gone", grants[i], driver.ErrNotHeld, entries[j].path)
				} else {
					retry = append(retry, i)
				}
			}
			if gone == 0 {
				retry = nil
				for _, i := range live {
					errs[i] = d.Renew(ctx, grants[i])
				}
			}
		case errors.Is(r.err, zk.ErrNoNode):
			// Which node is gone is not reported: ask each.
			for _, i := range live {
				errs[i] = d.Renew(ctx, grants[i])
			}
		default:
			for _, i := range live {
				errs[i] = fmt.Errorf("zookeeper: renew %s: %w", grants[i], readErr("check lock nodes", r.err))
			}
		}
		idx = retry
	}
}

// Release implements driver.Driver: it deletes g's node.
func (d *Driver) Release(ctx context.Context, g driver.Grant) error {
	e, err := d.grantEntry("release", g)
	if err != nil {
		return err
	}
	session, sent := e.zc.conn.SessionID(), time.Now()
	err = e.zc.conn.DeleteContext(ctx, e.path, -1)
	if ctxErr := ctx.Err(); err != nil && ctxErr != nil && errors.Is(err, ctxErr) {
		return fmt.Errorf("zookeeper: release %s: %w: %w", g, driver.ErrUnknownOutcome, ctxErr)
	}
	if err == nil {
		e.zc.recordWrite(session, sent)
	}
	if errors.Is(err, zk.ErrNoNode) {
		d.grants.Forget(e)
		return fmt.Errorf("zookeeper: release %s: %w", g, driver.ErrNotHeld)
	}
	if err != nil {
		return writeErr("release", err)
	}
	d.grants.Forget(e)
	return nil
}

// WatchLoss implements driver.LossWatcher with an exists watch on g's node
// whose event is handed to a function (zk.Conn.ExistsWFunc), so a watched
// grant costs no goroutine. The watch is set again after an event that
// does not end the grant (the node's data changed, the connection dropped
// the watch), 200 ms later when it cannot be set; the session's expiry
// reaches it as the event of a dropped watch.
func (d *Driver) WatchLoss(g driver.Grant, lost func(error)) (func(), error) {
	e, err := d.grantEntry("watch", g)
	if err != nil {
		return nil, err
	}
	w := &nodeLossWatch{d: d, e: e, loss: sessionlock.NewLoss(lost)}
	w.look()
	return w.stop, nil
}

// nodeLossWatch is the loss watch of one grant's node.
type nodeLossWatch struct {
	d    *Driver
	e    *entry
	loss *sessionlock.Loss

	mu      sync.Mutex
	stopped bool
	retry   *time.Timer
}

// lossRelook is how long a loss watch that could not be set waits before
// it tries again.
const lossRelook = 200 * time.Millisecond

func (w *nodeLossWatch) stop() {
	w.loss.Stop()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
	if w.retry != nil {
		w.retry.Stop()
	}
}

func (w *nodeLossWatch) lost(why string) {
	w.loss.Report(fmt.Errorf("%w: ZooKeeper node %s %s", driver.ErrLost, w.e.path, why))
}

const (
	nodeExpired = "is gone: the session expired"
	nodeDeleted = "was deleted (broken by an admin, or its session expired)"
)

// look sets the watch, or reports the loss it finds instead. It runs on
// WatchLoss's caller's goroutine or a timer's, never on the connection's.
func (w *nodeLossWatch) look() {
	w.mu.Lock()
	stopped := w.stopped
	w.mu.Unlock()
	if stopped || w.d.ctx.Err() != nil {
		return
	}
	ok, stat, err := w.e.zc.conn.ExistsWFunc(w.e.path, w.event)
	switch {
	case errors.Is(err, zk.ErrSessionExpired):
		w.lost(nodeExpired)
	case err != nil:
		// Disconnected: local validity covers the gap; look again.
		w.later(lossRelook)
	case !ok || stat.Czxid != w.e.czxid:
		w.lost(nodeDeleted)
	}
}

// event handles the watch's event, on the connection's receiving
// goroutine: it must not block, nor call the connection.
func (w *nodeLossWatch) event(ev zk.Event) {
	switch {
	case ev.Type == zk.EventNodeDeleted:
		w.lost(nodeDeleted)
	case errors.Is(ev.Err, zk.ErrSessionExpired):
		w.lost(nodeExpired)
	case ev.Type == zk.EventNotWatching:
		w.later(lossRelook)
	default:
		w.later(0)
	}
}

// later looks again after d, on a timer's goroutine.
func (w *nodeLossWatch) later(d time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.stopped {
		w.retry = time.AfterFunc(d, w.look)
	}
}
