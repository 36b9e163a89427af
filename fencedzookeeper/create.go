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

// create sends e's create and, right behind it on the connection, a listing
// of e's lock path (zk.Conn.MultiChildren). The server serves the listing
// once the create is applied. So it is the listing that would follow the
// create's answer, one round trip sooner. The create travels in one
// transaction with a write to the lock path's data, whose stat then carries
// the transaction's zxid: the new node's czxid, without another round trip.
// When ctx ends before the create is answered it returns ctx's error, and
// late (if not nil) is called with the outcome once it is known.
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
		&zk.CreateRequest{Path: e.lockPath + "/" + e.protectedPrefix() + lockMarker, Data: []byte(e.id.Owner), ACL: openACL,
			Flags: zk.FlagEphemeral | zk.FlagSequence},
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

// recoverCreate finishes a create that failed with r. It makes a missing
// lock path and creates once more. After a connection loss it looks for the
// node by its protected prefix, so a create the server applied is used,
// never orphaned. It ignores ctx, as a create in flight would.
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
	if err != nil && !errors.Is(err, zk.ErrNodeExists) && !errors.Is(err, zk.ErrNoAuth) &&
		!errors.Is(err, zk.ErrSessionExpired) && !errors.Is(err, zk.ErrNoNode) {
		// Connection loss: the create may have been applied.
		found, ferr := d.findProtected(e)
		switch {
		case ferr == nil && found != "":
			ok, stat, serr := e.zc.conn.Exists(found)
			if serr == nil && ok {
				r = created{path: found, czxid: stat.Czxid, session: stat.EphemeralOwner}
			}
		case ferr == nil:
			r.err = fmt.Errorf("%w: %v (no node with our protected prefix was created)", fenced.ErrUnavailable, err)
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
		if errors.Is(r.err, fenced.ErrUnavailable) || errors.Is(r.err, zk.ErrSessionExpired) {
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
