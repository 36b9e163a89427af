package fencedetcd

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/core/token"
)

var _ driver.Valuer = (*Driver)(nil)

// SetValue implements driver.Valuer the way etcd's election recipe
// proclaims (concurrency.Election.Proclaim). It overwrites the value of
// g's key, keeping its create revision (the fence) and its session, if
// the key still has g's create revision. `etcdctl elect -l NAME` then
// prints the value. From then on the driver recognises g's key by its
// create revision alone, since the owner token is no longer its value.
func (d *Driver) SetValue(ctx context.Context, g driver.Grant, value string) error {
	e := d.grants.Lookup(g.Key, g.Owner)
	if e == nil || !e.granted || g.Fence == 0 || uint64(e.rev) != g.Fence {
		return fmt.Errorf("etcd: set value %s: %w", g, fenced.ErrNotHeld)
	}
	e.proclaimed.Store(true)
	resp, err := d.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(e.etcdKey), "=", e.rev)).
		Then(clientv3.OpPut(e.etcdKey, value, clientv3.WithLease(e.s.id))).
		Commit()
	if err != nil {
		return writeErr("set value", err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("etcd: set value %s: %w: key %s is gone", g, fenced.ErrNotHeld, e.etcdKey)
	}
	return nil
}

// Value implements driver.Valuer: the holder as Inspect reports it and the
// value of its key, which is what `etcdctl elect NAME VALUE` campaigned with
// or a fenced leader proclaimed. A fenced holder that has not proclaimed (a
// lock, not an election) keeps its owner token in the key. Such a value (32
// hex digits, the form fenced's owner tokens have) is reported as "", so
// that the token is never shown.
func (d *Driver) Value(ctx context.Context, key string) (driver.LeaseInfo, string, error) {
	name := d.LockName(key)
	info, err := d.Inspect(ctx, key)
	if err != nil || !info.Held {
		return info, "", err
	}
	resp, err := d.cli.Get(ctx, name+"/", clientv3.WithFirstCreate()...)
	if err != nil {
		return info, "", readErr("read value", err)
	}
	if len(resp.Kvs) == 0 || uint64(resp.Kvs[0].CreateRevision) != info.Fence {
		// The holder changed between the two reads: report the newer one.
		return d.Value(ctx, key)
	}
	v := string(resp.Kvs[0].Value)
	if looksLikeOwner(v) {
		v = ""
	}
	if info.Owner == token.Short(string(resp.Kvs[0].Value)) && !looksLikeOwner(string(resp.Kvs[0].Value)) {
		// The value is not an owner token: name the holder by its etcd
		// lease, as for a foreign holder.
		info.Owner = fmt.Sprintf("lease:%x", resp.Kvs[0].Lease)
	}
	return info, v, nil
}

// looksLikeOwner reports whether v has the form of a fenced owner token.
func looksLikeOwner(v string) bool {
	if len(v) != 32 {
		return false
	}
	for _, c := range v {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}
