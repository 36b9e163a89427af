package fencedzookeeper

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fenced-dev/fenced/fencedzookeeper/internal/zk"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/core/ttlrule"
)

// Renew implements driver.Driver. Once the session has headroom for another
// g.TTL from now (awaitHeadroom), it syncs with the leader. Then it reads
// g's node, confirming that it still exists and belongs to the live session.
// The read is not concurrent with the sync: it must see what the sync made
// visible. The session itself is kept alive by the connection; g.TTL must
// not exceed the longest TTL the session covers.
func (d *Driver) Renew(ctx context.Context, g driver.Grant) error {
	if err := ttlrule.Check(g); err != nil {
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
		return fmt.Errorf("zookeeper: renew %s: %w: %w", g, fenced.ErrUnavailable, ctx.Err())
	}
	if r.err != nil {
		if errors.Is(r.err, zk.ErrSessionExpired) {
			d.grants.Forget(e)
			return fmt.Errorf("zookeeper: renew %s: %w: session expired", g, fenced.ErrNotHeld)
		}
		return r.err // classified by syncLeader or readErr
	}
	if !r.ok || r.stat.Czxid != e.czxid || r.stat.EphemeralOwner != e.session || e.zc.conn.SessionID() != e.session {
		// The grant is over. A node of ours that is still there goes now,
		// so that it cannot hold the key for as long as the session lives.
		d.grants.EndNow(e)
		return fmt.Errorf("zookeeper: renew %s: %w: node %s is gone or belongs to another session", g, fenced.ErrNotHeld, e.path)
	}
	if !d.grants.Extend(e, ttl, start) {
		return fmt.Errorf("zookeeper: renew %s: %w: the grant ended during the renewal", g, fenced.ErrNotHeld)
	}
	return nil
}

// checksPerMulti bounds the grants one RenewBatch transaction checks (a
// check is about a hundred bytes; the server refuses requests over its
// jute.maxbuffer, 1 MB by default).
const checksPerMulti = 1000

// RenewBatch implements driver.BatchRenewer. Per session, once it has
// headroom for the longest TTL renewed on it (awaitHeadroom), it sends one
// transaction of version checks (any version) on the grants' nodes per
// checksPerMulti grants. That replaces a sync and a read per grant. The
// transaction goes through the leader, like the sync Renew sends. It
// succeeds only if every node exists there, in the session the grant was
// made on (still the connection's session before and after). A node's path
// carries its entry's random UUID, so a node with that path is the grant's
// own node. When a check fails, the grants whose nodes are gone end and the
// rest are checked again. A failure that names no node falls back to Renew
// for each grant of the transaction.
func (d *Driver) RenewBatch(ctx context.Context, grants []driver.Grant) ([]error, error) {
	if err := ttlrule.CheckAll(grants); err != nil {
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
				errs[i] = fmt.Errorf("zookeeper: renew %s: %w", grants[i], fenced.ErrNotHeld)
				continue
			}
			if e.session != session {
				d.grants.EndNow(e)
				errs[i] = fmt.Errorf("zookeeper: renew %s: %w: node %s belongs to another session", grants[i], fenced.ErrNotHeld, e.path)
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
				errs[i] = fmt.Errorf("zookeeper: renew %s: %w: %w", grants[i], fenced.ErrUnavailable, ctx.Err())
			}
			return
		}
		if r.err == nil && zc.conn.SessionID() == session {
			for j, i := range live {
				if !d.grants.Extend(entries[j], grants[i].TTL, start) {
					errs[i] = fmt.Errorf("zookeeper: renew %s: %w: the grant ended during the renewal", grants[i], fenced.ErrNotHeld)
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
				errs[i] = fmt.Errorf("zookeeper: renew %s: %w: session expired", grants[i], fenced.ErrNotHeld)
			}
		case errors.Is(r.err, zk.ErrNoNode) && len(r.res) == len(live):
			gone := 0
			for j, i := range live {
				if errors.Is(r.res[j].Error, zk.ErrNoNode) {
					gone++
					d.grants.EndNow(entries[j])
					errs[i] = fmt.Errorf("zookeeper: renew %s: %w: node %s is gone", grants[i], fenced.ErrNotHeld, entries[j].path)
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
