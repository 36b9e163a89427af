package etcd

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fenced-dev/fenced/driver"
)

// session is one etcd lease shared by every key this driver holds or
// queues with the same TTL. A session holds at most one key per lock name
// (the key's name is derived from the lease ID), so two owners of one driver
// contending for the same name use two sessions.
type session struct {
	id    clientv3.LeaseID
	ttl   int64           // seconds, as granted by the server
	names map[string]bool // lock names with a key (or a reservation) on it
	dead  bool
}

// entryID names a key this driver put (or may have put) for an owner.
type entryID struct{ key, owner string }

// entry tracks a key this driver put. Until its deadline is extended by a
// renewal (or by its waiter's keep-alive), the entry stands; once the
// deadline passes the driver deletes the key, so a grant nobody renews ends
// after its TTL even while other grants keep the shared session alive.
type entry struct {
	id      entryID
	etcdKey string
	name    string
	s       *session
	rev     int64 // create revision once known
	granted bool
	// deadline is when the driver deletes the key unless extended.
	deadline time.Time
	timer    *time.Timer
}

// errSessionGone means the etcd lease behind a session has expired or was
// revoked.
var errSessionGone = errors.New("etcd session (lease) expired or revoked")

// ttlSeconds rounds ttl up to whole seconds, as etcd counts lease TTLs.
func ttlSeconds(ttl time.Duration) int64 {
	s := int64((ttl + time.Second - 1) / time.Second)
	return max(s, 1)
}

// reserve returns a live session of ttl with no key under name and marks
// name as used on it, granting a new etcd lease when none fits.
func (d *Driver) reserve(ctx context.Context, ttl time.Duration, name string) (*session, error) {
	secs := ttlSeconds(ttl)
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil, driver.ErrClosed
	}
	for _, s := range d.sessions[secs] {
		if !s.dead && !s.names[name] {
			s.names[name] = true
			d.mu.Unlock()
			return s, nil
		}
	}
	d.mu.Unlock()
	resp, err := d.cli.Grant(ctx, secs)
	if err != nil {
		return nil, readErr("grant session lease", err)
	}
	s := &session{id: resp.ID, ttl: resp.TTL, names: map[string]bool{name: true}}
	d.mu.Lock()
	d.sessions[secs] = append(d.sessions[secs], s)
	d.mu.Unlock()
	return s, nil
}

// unreserve frees name on s.
func (d *Driver) unreserve(s *session, name string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(s.names, name)
}

// markDead forgets s: it will never be handed out again.
func (d *Driver) markDead(s *session) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if s.dead {
		return
	}
	s.dead = true
	for k, list := range d.sessions {
		for i, x := range list {
			if x == s {
				d.sessions[k] = append(list[:i:i], list[i+1:]...)
			}
		}
	}
}

// keepAlive extends s by its TTL from now (server's clock). The request is
// sent after the call starts, so the session then outlives any local
// validity measured from a moment before the call.
func (d *Driver) keepAlive(ctx context.Context, s *session) error {
	_, err := d.cli.KeepAliveOnce(ctx, s.id)
	if err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			d.markDead(s)
			return errSessionGone
		}
		return readErr("keep session alive", err)
	}
	return nil
}

// track records (or refreshes) the entry for id and (re)arms its deadline.
func (d *Driver) track(e *entry, ttl time.Duration, from time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return
	}
	if old, ok := d.entries[e.id]; ok && old != e && old.timer != nil {
		old.timer.Stop()
	}
	d.entries[e.id] = e
	e.deadline = from.Add(ttl)
	if e.timer != nil {
		e.timer.Stop()
	}
	e.timer = time.AfterFunc(time.Until(e.deadline), func() { d.reap(e) })
}

// lookup returns the entry for key and owner, if any.
func (d *Driver) lookup(key, owner string) *entry {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.entries[entryID{key, owner}]
}

// forget drops e (if it is still the current entry for its id) and frees
// its name on the session.
func (d *Driver) forget(e *entry) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if cur, ok := d.entries[e.id]; ok && cur == e {
		delete(d.entries, e.id)
	}
	if e.timer != nil {
		e.timer.Stop()
	}
	delete(e.s.names, e.name)
}

// reap deletes e's key once its deadline has passed without renewal. A
// failed delete is tried again a second later while the driver is open.
func (d *Driver) reap(e *entry) {
	d.mu.Lock()
	if d.closed || d.entries[e.id] != e || time.Now().Before(e.deadline) {
		d.mu.Unlock()
		return
	}
	d.mu.Unlock()
	d.wg.Add(1)
	defer d.wg.Done()
	ctx, cancel := context.WithTimeout(d.ctx, 5*time.Second)
	defer cancel()
	if _, err := d.deleteOwned(ctx, e); err != nil && d.ctx.Err() == nil {
		d.mu.Lock()
		if d.entries[e.id] == e && !d.closed {
			e.timer = time.AfterFunc(time.Second, func() { d.reap(e) })
		}
		d.mu.Unlock()
		return
	}
	d.forget(e)
}

// deleteOwned deletes e's key if it still carries e's owner, recording the
// fence of a held key. It reports whether a key was deleted.
func (d *Driver) deleteOwned(ctx context.Context, e *entry) (bool, error) {
	ops := []clientv3.Op{clientv3.OpDelete(e.etcdKey)}
	if e.granted && e.rev > 0 {
		ops = append(ops, clientv3.OpPut(d.recordKey(e.name), fmt.Sprint(e.rev)))
	}
	resp, err := d.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.Value(e.etcdKey), "=", e.id.owner)).
		Then(ops...).
		Commit()
	if err != nil {
		return false, writeErr("delete key", err)
	}
	return resp.Succeeded, nil
}

// recordKey is where the fence of the last released or broken grant of a
// lock name is kept. It sits beside the lock's waiter keys (name + "/..."),
// outside the range etcd's recipe scans.
func (d *Driver) recordKey(name string) string { return name }

// readErr wraps the failure of a request that changes nothing.
func readErr(op string, err error) error {
	if ctxErr(err) {
		return err
	}
	return fmt.Errorf("etcd: %s: %w: %v", op, driver.ErrUnavailable, err)
}

// writeErr wraps the failure of a request that may have been applied.
func writeErr(op string, err error) error {
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("etcd: %s: %w", op, errSessionGone)
	}
	if ctxErr(err) {
		return fmt.Errorf("etcd: %s: %w: %w", op, driver.ErrUnknownOutcome, err)
	}
	return fmt.Errorf("etcd: %s: %w: %v", op, driver.ErrUnknownOutcome, err)
}

func ctxErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}
