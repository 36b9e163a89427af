package fencedzookeeper

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/fenced-dev/fenced/fencedzookeeper/internal/zk"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/backend/sessionlock"
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
//
// A grant confirmed after from+ttl (its answer came later than its own
// validity, on a loaded machine) is kept until a ttl from now instead.
// Its owner is told it came too late and asks again as the same owner,
// which confirms this grant with a fresh validity (confirm). Ended at once,
// it would race that request, which then fails with ErrNotHeld (issue 38).
// Keeping the node longer only keeps the key from others longer; no
// validity rests on it. A holder that gives up instead releases it.
func (d *Driver) grant(e *entry, ttl time.Duration, from time.Time) (uint64, error) {
	e.granted = true
	if now := time.Now(); from.Add(ttl).Before(now) {
		from = now
	}
	if !d.grants.Track(e, ttl, from) && !d.grants.Extend(e, ttl, from) {
		return 0, fmt.Errorf("zookeeper: acquire %s: %w: the grant ended as it was confirmed", e.id.Key, fenced.ErrNotHeld)
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
		if _, err := conn.Create(cur, nil, 0, openACL); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return err
		}
	}
	return nil
}

// grantEntry returns the entry for g, or ErrNotHeld.
func (d *Driver) grantEntry(op string, g driver.Grant) (*entry, error) {
	e := d.grants.Lookup(g.Key, g.Owner)
	if e == nil || !e.granted || g.Fence == 0 || uint64(e.czxid) != g.Fence {
		return nil, fmt.Errorf("zookeeper: %s %s: %w", op, g, fenced.ErrNotHeld)
	}
	return e, nil
}
