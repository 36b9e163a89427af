package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/fenced-dev/fenced/driver"
)

// lockMarker separates the protected prefix from the sequence number in
// lock node names, as in Curator's InterProcessMutex ("lock-").
const lockMarker = "lock-"

// entryID names a node this driver created (or may have created).
type entryID struct{ key, owner string }

// entry tracks one lock node of this driver. Until its deadline is extended
// by a renewal the node stands; once the deadline passes the driver deletes
// it, so a grant nobody renews ends after its TTL even though the process
// keeps its session alive.
type entry struct {
	id       entryID
	zc       *zsession
	lockPath string
	uuid     string
	path     string // full node path once known
	session  int64
	czxid    int64
	granted  bool
	deadline time.Time
	timer    *time.Timer
}

func (e *entry) stop() {
	if e.timer != nil {
		e.timer.Stop()
	}
}

func (e *entry) protectedPrefix() string { return "_c_" + e.uuid + "-" }

// child is one lock node under a lock path.
type child struct {
	name string
	seq  int64
}

// sortChildren orders lock nodes by sequence, as Curator does, and rejects
// nodes that are not lock nodes.
func sortChildren(lockPath string, names []string) ([]child, error) {
	out := make([]child, 0, len(names))
	for _, n := range names {
		i := strings.LastIndex(n, lockMarker)
		if i < 0 {
			return nil, fmt.Errorf("zookeeper: lock path %s holds foreign node %q (not a lock node \"...lock-<sequence>\"): remove it or use another chroot", lockPath, n)
		}
		seq, err := strconv.ParseInt(n[i+len(lockMarker):], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("zookeeper: lock path %s holds foreign node %q (no sequence number after \"lock-\"): remove it or use another chroot", lockPath, n)
		}
		out = append(out, child{n, seq})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].seq < out[j].seq })
	return out, nil
}

func (d *Driver) lookup(key, owner string) *entry {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.entries[entryID{key, owner}]
}

// track records e and (re)arms its deadline at from+ttl.
func (d *Driver) track(e *entry, ttl time.Duration, from time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return
	}
	if old, ok := d.entries[e.id]; ok && old != e {
		old.stop()
	}
	d.entries[e.id] = e
	e.deadline = from.Add(ttl)
	e.stop()
	e.timer = time.AfterFunc(time.Until(e.deadline), func() { d.reap(e) })
}

func (d *Driver) forget(e *entry) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.entries[e.id] == e {
		delete(d.entries, e.id)
	}
	e.stop()
}

// reap deletes e's node once its deadline passed without renewal, trying
// again a second later if that fails.
func (d *Driver) reap(e *entry) {
	d.mu.Lock()
	if d.closed || d.entries[e.id] != e || time.Now().Before(e.deadline) {
		d.mu.Unlock()
		return
	}
	d.mu.Unlock()
	if err := d.deleteNode(e); err != nil {
		d.mu.Lock()
		if d.entries[e.id] == e && !d.closed {
			e.timer = time.AfterFunc(time.Second, func() { d.reap(e) })
		}
		d.mu.Unlock()
		return
	}
	d.forget(e)
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
	var err error
	if e.granted && e.czxid != 0 {
		_, err = e.zc.conn.Multi(&zk.DeleteRequest{Path: path, Version: -1}, &zk.SetDataRequest{Path: e.lockPath, Data: []byte(strconv.FormatInt(e.czxid, 10)), Version: -1})
	} else {
		err = e.zc.conn.Delete(path, -1)
	}
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
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

// createNode creates e's ephemeral sequential node. On a connection loss it
// looks for the node by its protected prefix before giving up, so a create
// the server applied is used, never orphaned. If ctx ends first, the node
// is deleted as soon as the create returns.
func (d *Driver) createNode(ctx context.Context, e *entry) error {
	type result struct {
		path string
		err  error
	}
	ch := make(chan result, 1)
	data := []byte(e.id.owner)
	go func() {
		name := e.lockPath + "/" + e.protectedPrefix() + lockMarker
		p, err := e.zc.conn.Create(name, data, zk.FlagEphemeral|zk.FlagSequence, d.acl)
		if errors.Is(err, zk.ErrNoNode) {
			// The lock path does not exist yet: the create failed, nothing
			// was applied. Make the path and create once.
			if perr := d.ensureParents(e.zc.conn, e.lockPath); perr != nil {
				ch <- result{"", perr}
				return
			}
			p, err = e.zc.conn.Create(name, data, zk.FlagEphemeral|zk.FlagSequence, d.acl)
		}
		if err != nil && !errors.Is(err, zk.ErrNodeExists) && !errors.Is(err, zk.ErrNoAuth) && !errors.Is(err, zk.ErrSessionExpired) {
			// Connection loss: the create may have been applied.
			if found, ferr := d.findProtected(e); ferr == nil && found != "" {
				p, err = found, nil
			} else if ferr == nil {
				err = fmt.Errorf("%w: %v (no node with our protected prefix was created)", driver.ErrUnavailable, err)
			}
		}
		ch <- result{p, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			if errors.Is(r.err, driver.ErrUnavailable) || errors.Is(r.err, zk.ErrSessionExpired) {
				return fmt.Errorf("zookeeper: create lock node: %w", r.err)
			}
			if errors.Is(r.err, zk.ErrNoAuth) {
				return fmt.Errorf("zookeeper: create lock node under %s: %w", e.lockPath, r.err)
			}
			return writeErr("create lock node", r.err)
		}
		e.path = r.path
		return nil
	case <-ctx.Done():
		go func() {
			if r := <-ch; r.err == nil {
				_ = e.zc.conn.Delete(r.path, -1)
			}
		}()
		return context.Cause(ctx)
	}
}

// state reads the lock's children and our node's stat, concurrently.
func (d *Driver) state(e *entry) (children []child, stat *zk.Stat, err error) {
	var (
		names []string
		cerr  error
		wg    sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		names, _, cerr = e.zc.conn.Children(e.lockPath)
	}()
	ok, stat, serr := e.zc.conn.Exists(e.path)
	wg.Wait()
	if cerr != nil {
		return nil, nil, readErr("list lock nodes", cerr)
	}
	if serr != nil {
		return nil, nil, readErr("stat lock node", serr)
	}
	if !ok || stat.EphemeralOwner != e.session {
		return nil, nil, fmt.Errorf("zookeeper: %w: our lock node %s is gone (session expired or broken)", driver.ErrUnavailable, e.path)
	}
	children, err = sortChildren(e.lockPath, names)
	return children, stat, err
}

func (d *Driver) newEntry(ctx context.Context, key, owner string, ttl time.Duration) (*entry, error) {
	zc, err := d.session(ctx, ttl)
	if err != nil {
		return nil, err
	}
	return &entry{id: entryID{key, owner}, zc: zc, lockPath: d.lockPath(key), uuid: newUUID(), session: zc.conn.SessionID()}, nil
}

// TryAcquire implements driver.Driver: create a node, and delete it again
// unless it is the lowest.
func (d *Driver) TryAcquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	start := time.Now()
	if e := d.lookup(key, owner); e != nil {
		return d.confirm(ctx, e, ttl, start)
	}
	e, err := d.newEntry(ctx, key, owner, ttl)
	if err != nil {
		return 0, err
	}
	if err := d.createNode(ctx, e); err != nil {
		if errors.Is(err, driver.ErrUnknownOutcome) {
			d.track(e, ttl, start) // a retry finds it; else the reaper deletes it
		}
		return 0, err
	}
	children, stat, err := d.state(e)
	if err != nil || len(children) == 0 || e.lockPath+"/"+children[0].name != e.path {
		d.track(e, 0, start)
		d.reap(e)
		if err != nil {
			return 0, err
		}
		return 0, &driver.HeldError{Key: key}
	}
	e.czxid, e.granted = stat.Czxid, true
	d.track(e, ttl, start)
	return uint64(e.czxid), nil
}

// confirm serves a repeated TryAcquire by the owner of e.
func (d *Driver) confirm(ctx context.Context, e *entry, ttl time.Duration, start time.Time) (uint64, error) {
	if e.path == "" {
		p, err := d.findProtected(e)
		if err != nil {
			return 0, readErr("find lock node", err)
		}
		if p == "" {
			d.forget(e)
			return d.TryAcquire(ctx, e.id.key, e.id.owner, ttl)
		}
		e.path = p
	}
	children, stat, err := d.state(e)
	if err != nil {
		return 0, err
	}
	if len(children) == 0 || e.lockPath+"/"+children[0].name != e.path {
		return 0, &driver.HeldError{Key: e.id.key}
	}
	e.czxid, e.granted = stat.Czxid, true
	d.track(e, ttl, start)
	return uint64(e.czxid), nil
}

// Acquire implements driver.Queuer: create a node, then wait for the
// deletion of the node just before it until it is the lowest.
func (d *Driver) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	start := time.Now()
	e, err := d.newEntry(ctx, key, owner, ttl)
	if err != nil {
		return 0, err
	}
	if err := d.createNode(ctx, e); err != nil {
		if errors.Is(err, driver.ErrUnknownOutcome) {
			d.track(e, 0, start)
			d.reap(e)
		}
		return 0, err
	}
	d.track(e, max(ttl, time.Hour), start) // waiting: the session keeps the node
	fail := func(err error) (uint64, error) {
		d.track(e, 0, start)
		go d.reap(e)
		if ctx.Err() != nil {
			return 0, context.Cause(ctx)
		}
		return 0, err
	}
	for {
		children, stat, err := d.state(e)
		if err != nil {
			return fail(err)
		}
		idx := -1
		for i, c := range children {
			if e.lockPath+"/"+c.name == e.path {
				idx = i
			}
		}
		if idx == 0 {
			e.czxid, e.granted = stat.Czxid, true
			d.track(e, ttl, time.Now())
			return uint64(e.czxid), nil
		}
		if idx < 0 {
			return fail(fmt.Errorf("zookeeper: %w: our lock node %s vanished", driver.ErrUnavailable, e.path))
		}
		ok, _, ch, err := e.zc.conn.ExistsW(e.lockPath + "/" + children[idx-1].name)
		if err != nil {
			return fail(readErr("watch predecessor", err))
		}
		if !ok {
			continue
		}
		select {
		case <-ch:
		case <-e.zc.expiredC():
			return fail(fmt.Errorf("zookeeper: %w: session expired while waiting", driver.ErrUnavailable))
		case <-ctx.Done():
			return fail(ctx.Err())
		}
	}
}

// grantEntry returns the entry for g, or ErrNotHeld.
func (d *Driver) grantEntry(op string, g driver.Grant) (*entry, error) {
	e := d.lookup(g.Key, g.Owner)
	if e == nil || !e.granted || g.Fence == 0 || uint64(e.czxid) != g.Fence {
		return nil, fmt.Errorf("zookeeper: %s %s: %w", op, g, driver.ErrNotHeld)
	}
	return e, nil
}

// Renew implements driver.Driver: it confirms, after a sync with the
// leader, that g's node still exists and belongs to the live session. The
// session itself is kept alive by the connection; ttl must not exceed the
// session timeout.
func (d *Driver) Renew(ctx context.Context, g driver.Grant, ttl time.Duration) error {
	start := time.Now()
	e, err := d.grantEntry("renew", g)
	if err != nil {
		return err
	}
	if ttl > e.zc.timeout {
		return fmt.Errorf("zookeeper: renew %s: %w: TTL %v exceeds the session timeout %v", g, driver.ErrInvalidTTL, ttl, e.zc.timeout)
	}
	type result struct {
		ok   bool
		stat *zk.Stat
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		var wg sync.WaitGroup
		var serr error
		wg.Add(1)
		go func() { defer wg.Done(); _, serr = e.zc.conn.Sync(e.path) }()
		ok, stat, err := e.zc.conn.Exists(e.path)
		wg.Wait()
		if err == nil && serr != nil && !errors.Is(serr, zk.ErrNoNode) {
			err = serr
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
			d.forget(e)
			return fmt.Errorf("zookeeper: renew %s: %w: session expired", g, driver.ErrNotHeld)
		}
		return readErr("renew", r.err)
	}
	if !r.ok || r.stat.Czxid != e.czxid || r.stat.EphemeralOwner != e.session || e.zc.conn.SessionID() != e.session {
		d.forget(e)
		return fmt.Errorf("zookeeper: renew %s: %w: node %s is gone or belongs to another session", g, driver.ErrNotHeld, e.path)
	}
	d.track(e, ttl, start)
	return nil
}

// Release implements driver.Driver: it deletes g's node and records its
// fence on the lock path for Inspect, in one transaction.
func (d *Driver) Release(ctx context.Context, g driver.Grant) error {
	e, err := d.grantEntry("release", g)
	if err != nil {
		return err
	}
	ch := make(chan error, 1)
	go func() {
		_, err := e.zc.conn.Multi(&zk.DeleteRequest{Path: e.path, Version: -1},
			&zk.SetDataRequest{Path: e.lockPath, Data: []byte(strconv.FormatInt(e.czxid, 10)), Version: -1})
		ch <- err
	}()
	select {
	case err = <-ch:
	case <-ctx.Done():
		return fmt.Errorf("zookeeper: release %s: %w: %w", g, driver.ErrUnknownOutcome, ctx.Err())
	}
	if errors.Is(err, zk.ErrNoNode) {
		d.forget(e)
		return fmt.Errorf("zookeeper: release %s: %w", g, driver.ErrNotHeld)
	}
	if err != nil {
		return writeErr("release", err)
	}
	d.forget(e)
	return nil
}

// WatchLoss implements driver.LossWatcher with a watch on g's node and on
// its session's expiry.
func (d *Driver) WatchLoss(ctx context.Context, g driver.Grant) (<-chan error, error) {
	e, err := d.grantEntry("watch", g)
	if err != nil {
		return nil, err
	}
	out := make(chan error, 1)
	go func() {
		defer close(out)
		lost := func(why string) {
			if ctx.Err() == nil {
				out <- fmt.Errorf("%w: ZooKeeper node %s %s", driver.ErrLost, e.path, why)
			}
		}
		for ctx.Err() == nil {
			ok, stat, ch, err := e.zc.conn.ExistsW(e.path)
			if errors.Is(err, zk.ErrSessionExpired) {
				lost("is gone: the session expired")
				return
			}
			if err == nil && (!ok || stat.Czxid != e.czxid) {
				lost("was deleted (broken by an admin, or its session expired)")
				return
			}
			if err != nil {
				// Disconnected: local validity covers the gap; look again.
				select {
				case <-ctx.Done():
					return
				case <-time.After(200 * time.Millisecond):
				}
				continue
			}
			select {
			case ev := <-ch:
				switch {
				case ev.Type == zk.EventNodeDeleted:
					lost("was deleted (broken by an admin, or its session expired)")
					return
				case errors.Is(ev.Err, zk.ErrSessionExpired):
					lost("is gone: the session expired")
					return
				case ev.Type == zk.EventNotWatching:
					select {
					case <-ctx.Done():
						return
					case <-time.After(200 * time.Millisecond):
					}
				}
			case <-e.zc.expiredC():
				lost("is gone: the session expired")
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}
