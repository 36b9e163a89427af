package fencedetcd

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/backend/errclass"
	"github.com/fenced-dev/fenced/internal/backend/sessionlock"
)

// session is one etcd lease shared by every key this driver holds or
// queues with the same TTL. A session holds at most one key per lock name
// (the key's name is derived from the lease ID), so two owners of one driver
// contending for the same name use two sessions.
type session struct {
	id    clientv3.LeaseID
	ttl   int64           // seconds, as granted by the server
	names map[string]bool // lock names with a key (or a reservation) on it
	// releasing counts, per lock name, the releases whose unconditional
	// delete of the name's key on this session is in flight (see
	// Driver.pinName). A name they pin stays in names until they are
	// answered, even once its entry is forgotten.
	releasing map[string]int
	dead      bool
	// until is when the session lapses at the latest unless kept alive:
	// the send time of its last confirmed keep-alive (or grant) plus its
	// TTL. Past it the session is dropped without asking the server.
	until time.Time
	// listing is the newest listing of the session's keys, kept for a
	// moment for the renewals that share it (see attachedKeys); guarded by
	// Driver.mu.
	listing *keyListing
}

// entry tracks a key this driver put. Its deadline (kept by the driver's
// reaper) is pushed back by every renewal, or by its waiter's keep-alives.
// Once it passes, the driver deletes the key. So a grant nobody renews ends
// after its TTL, even while other grants keep the shared session alive.
type entry struct {
	sessionlock.Tracking
	id      sessionlock.ID
	etcdKey string
	name    string
	s       *session
	rev     int64 // create revision once known
	granted bool
	// freed is set (under Driver.mu) once e is forgotten and its lock
	// name given back on its session (see freeName): another grant may
	// then put a key of that name there.
	freed bool
	// proclaimed is set (before the write) once SetValue replaced the
	// owner token in the key's value with a leader's value; from then on
	// the key is recognised by its create revision alone.
	proclaimed atomic.Bool
}

// holds reports whether kv is e's key as e put it: its create revision,
// and its owner token as value unless e proclaimed a value since.
func (e *entry) holds(kv *mvccpb.KeyValue) bool {
	return kv.CreateRevision == e.rev && (e.proclaimed.Load() || string(kv.Value) == e.id.Owner)
}

// ownedCmp is the comparison a transaction on e's key makes to be sure the
// key is still e's.
func (e *entry) ownedCmp() clientv3.Cmp {
	if e.proclaimed.Load() {
		return clientv3.Compare(clientv3.CreateRevision(e.etcdKey), "=", e.rev)
	}
	return clientv3.Compare(clientv3.Value(e.etcdKey), "=", e.id.Owner)
}

// GrantID implements sessionlock.Entry.
func (e *entry) GrantID() sessionlock.ID { return e.id }

// grant marks e granted, moves its deadline to from+ttl and returns its
// fence. It fails with ErrNotHeld if e ended meanwhile (see
// sessionlock.Grants.Extend): its key is being deleted, or is gone.
func (d *Driver) grant(e *entry, ttl time.Duration, from time.Time) (uint64, error) {
	e.granted = true
	if !d.grants.Extend(e, ttl, from) {
		return 0, fmt.Errorf("etcd: acquire %s: %w: the grant ended as it was confirmed", e.id.Key, fenced.ErrNotHeld)
	}
	return uint64(e.rev), nil
}

// errSessionGone means the etcd lease behind a session has expired or was
// revoked.
var errSessionGone = errors.New("etcd session (lease) expired or revoked")

// sessionSeconds is the TTL of the session that carries grants of ttl:
// ttl rounded up to whole seconds (etcd counts lease TTLs in seconds) plus
// one second. The headroom lets an acquisition or renewal skip the
// keep-alive when one was sent within the last second: the session then
// provably outlives the grant's validity already. A busy client thus sends
// about one keep-alive per second per session, however many grants it
// makes, at the price of a crashed holder blocking others one second
// longer.
func sessionSeconds(ttl time.Duration) int64 { return int64(Expiry.Rounded(ttl) / time.Second) }

// reserve returns a live session of ttl with no key under name and marks
// name as used on it, granting a new etcd lease when none fits.
func (d *Driver) reserve(ctx context.Context, ttl time.Duration, name string) (*session, error) {
	secs := sessionSeconds(ttl)
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil, fenced.ErrClosed
	}
	now := time.Now()
	for _, s := range d.sessions[secs] {
		if !s.dead && now.After(s.until) {
			d.markDeadLocked(s)
			continue
		}
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
	s := &session{id: resp.ID, ttl: resp.TTL, names: map[string]bool{name: true}, until: now.Add(time.Duration(resp.TTL) * time.Second)}
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
	d.markDeadLocked(s)
}

func (d *Driver) markDeadLocked(s *session) {
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

// covers reports whether s is known to outlive from+ttl at the server: its
// last confirmed keep-alive (or grant) was sent late enough.
func (d *Driver) covers(s *session, from time.Time, ttl time.Duration) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return !s.until.Before(from.Add(ttl))
}

// keepAlive extends s by its TTL from now (server's clock). The request is
// sent after the call starts, so the session then outlives any local
// validity measured from a moment before the call.
func (d *Driver) keepAlive(ctx context.Context, s *session) error {
	sent := time.Now()
	ch, err := d.ka.send(int64(s.id))
	if err != nil {
		return readErr("keep session alive", err)
	}
	select {
	case r := <-ch:
		if r.err != nil {
			return r.err
		}
		if r.ttl <= 0 {
			d.markDead(s)
			return errSessionGone
		}
		d.mu.Lock()
		if u := sent.Add(time.Duration(r.ttl) * time.Second); u.After(s.until) {
			s.until = u
		}
		d.mu.Unlock()
		return nil
	case <-ctx.Done():
		return readErr("keep session alive", ctx.Err())
	}
}

// freeName frees e's lock name on its session (e was forgotten). A later
// grant of the driver may then put a key of the same name on the session.
// No delete of e's key can remove that key: a delete either compares the
// key's create revision or owner, or is a release's plain delete, which
// holds the name (pinName) until it is answered, so the name is freed only
// then.
func (d *Driver) freeName(e *entry) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e.freed = true
	if e.s.releasing[e.name] == 0 {
		delete(e.s.names, e.name)
	}
}

// pinName keeps e's lock name reserved on its session until unpinName, so
// that no grant of the driver puts another key of that name on the session
// meanwhile: the only key of that name the session can then have is e's.
// It reports false, pinning nothing, if e was forgotten already (its name
// may be another grant's by now).
func (d *Driver) pinName(e *entry) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if e.freed {
		return false
	}
	if e.s.releasing == nil {
		e.s.releasing = map[string]int{}
	}
	e.s.releasing[e.name]++
	return true
}

// unpinName ends a pinName; the last one frees e's name if e was forgotten
// meanwhile.
func (d *Driver) unpinName(e *entry) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if n := e.s.releasing[e.name] - 1; n > 0 {
		e.s.releasing[e.name] = n
		return
	}
	delete(e.s.releasing, e.name)
	if e.freed {
		delete(e.s.names, e.name)
	}
}

// endEntry deletes e's key if it is still e's (the reaper calls it when
// e's deadline passed without renewal, and abandoning a key calls it).
func (d *Driver) endEntry(e *entry) error {
	ctx, cancel := context.WithTimeout(d.ctx, 5*time.Second)
	defer cancel()
	_, err := d.deleteOwned(ctx, e)
	return err
}

// reapBatch is how many keys the reaper deletes in one transaction (see
// endEntries): each is a nested transaction of one comparison and one
// delete, well within etcd's --max-txn-ops (128 by default).
const reapBatch = 32

// endEntries deletes the keys of es that are still theirs, in one
// transaction of one nested transaction per key (so one key already gone
// or taken over fails only its own comparison; a server whose
// --max-txn-ops is set below reapBatch gets them one at a time). The reaper calls it with
// the entries due together: after an outage a driver holding many
// thousands of grants finds them all due at once, and a request per key,
// each waiting for the store, would leave keys standing for a long time
// after the store is back.
func (d *Driver) endEntries(es []*entry) []error {
	if len(es) == 1 {
		return []error{d.endEntry(es[0])}
	}
	ctx, cancel := context.WithTimeout(d.ctx, 5*time.Second)
	defer cancel()
	ops := make([]clientv3.Op, len(es))
	for i, e := range es {
		ops[i] = clientv3.OpTxn([]clientv3.Cmp{e.ownedCmp()}, []clientv3.Op{clientv3.OpDelete(e.etcdKey)}, nil)
	}
	_, err := d.cli.Txn(ctx).Then(ops...).Commit()
	errs := make([]error, len(es))
	if errors.Is(err, rpctypes.ErrTooManyOps) {
		// The server's --max-txn-ops is below reapBatch: one at a time.
		for i, e := range es {
			errs[i] = d.endEntry(e)
		}
		return errs
	}
	if err != nil {
		err = writeErr("delete keys", err)
		for i := range errs {
			errs[i] = err
		}
	}
	return errs
}

// deleteOwned deletes e's key if it still carries e's owner (its fence was
// recorded when it was put). It reports whether a key was deleted.
func (d *Driver) deleteOwned(ctx context.Context, e *entry) (bool, error) {
	resp, err := d.cli.Txn(ctx).
		If(e.ownedCmp()).
		Then(clientv3.OpDelete(e.etcdKey)).
		Commit()
	if err != nil {
		return false, writeErr("delete key", err)
	}
	return resp.Succeeded, nil
}

// recordKey is where the newest fence of a lock name is kept, for Inspect
// to report once the name is free. It sits beside the lock's waiter keys
// (name + "/..."), outside the range etcd's recipes scan.
func (d *Driver) recordKey(name string) string { return name }

// recordPut records the fence of the key that the same transaction puts
// under lock name: the record's value is empty, and its mod revision is the
// transaction's revision, which is the new key's create revision, its fence.
// So the record costs no write of its own at release, and it holds a fence
// at least as new as any grant of the name, whether that grant is released,
// broken or expires with its session. (A waiter's key that never became a
// grant is recorded too: no later grant gets a lower fence, which is what a
// guard or fence.Sequencer needs of it.) Break records the broken holder's
// fence as the value instead (see docs/design-notes.md for the older form).
func (d *Driver) recordPut(name string) clientv3.Op { return clientv3.OpPut(d.recordKey(name), "") }

// recordedFence is the fence the record kv of a lock name holds (see
// recordPut).
func recordedFence(kv *mvccpb.KeyValue) (uint64, error) {
	if len(kv.Value) == 0 {
		return uint64(kv.ModRevision), nil
	}
	f, err := strconv.ParseUint(string(kv.Value), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("record %s holds %q, not a fence", kv.Key, kv.Value)
	}
	return f, nil
}

// classify is etcd's errclass.Func: a lease that is not found means
// the session is gone; any other failure of the client may have come
// after the request was sent.
func classify(err error) error {
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return errSessionGone
	}
	return fenced.ErrUnknownOutcome
}

// readErr wraps the failure of a request that changes nothing; the end
// of the caller's context is returned as it is.
func readErr(op string, err error) error {
	if ctxErr(err) {
		return err
	}
	return fmt.Errorf("etcd: %s: %w", op, errclass.Wrap(err, false, classify))
}

// writeErr wraps the failure of a request that may have been applied.
func writeErr(op string, err error) error {
	return fmt.Errorf("etcd: %s: %w", op, errclass.Wrap(err, true, classify))
}

func ctxErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// getKey reads key: its KeyValue (nil when absent) and the store's
// revision at the read.
func (d *Driver) getKey(ctx context.Context, key string) (*mvccpb.KeyValue, int64, error) {
	resp, err := d.cli.Get(ctx, key)
	if err != nil {
		return nil, 0, readErr("read key", err)
	}
	if len(resp.Kvs) == 0 {
		return nil, resp.Header.Revision, nil
	}
	return resp.Kvs[0], resp.Header.Revision, nil
}
