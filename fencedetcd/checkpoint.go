package fencedetcd

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/core/capability"
)

var _ driver.Checkpointer = (*Driver)(nil)

// checkpointSuffix follows a key's lock name in the name of its
// checkpoint, prefix+K+"%checkpoint". An escaped key has a '%' only before
// 2F or 25, so the name is no other key's lock name, and it has no '/'
// after the prefix, so it is in no lock's range of waiter keys (List and
// Inspect pass it by).
const checkpointSuffix = "%checkpoint"

// checkpointName returns the etcd key of key's checkpoint.
func (d *Driver) checkpointName(key string) string { return d.LockName(key) + checkpointSuffix }

// Checkpoint implements driver.Checkpointer in one transaction: it puts the
// checkpoint (the fence, 8 bytes big-endian, then the value; with no etcd
// lease, so it outlives the grant) only if g's holder key still has g's
// create revision. A key created at that revision that still exists is the
// oldest of its lock's keys, so it holds the lock: a later grant exists
// only once it is gone.
func (d *Driver) Checkpoint(ctx context.Context, g driver.Grant, value []byte) error {
	if err := capability.CheckCheckpoint(value); err != nil {
		return fmt.Errorf("etcd: checkpoint %q: %w", g.Key, err)
	}
	e := d.grants.Lookup(g.Key, g.Owner)
	if e == nil || !e.granted || g.Fence == 0 || uint64(e.rev) != g.Fence {
		return fmt.Errorf("etcd: checkpoint %s: %w", g, fenced.ErrNotHeld)
	}
	rec := binary.BigEndian.AppendUint64(make([]byte, 0, 8+len(value)), g.Fence)
	rec = append(rec, value...)
	resp, err := d.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(e.etcdKey), "=", e.rev)).
		Then(clientv3.OpPut(d.checkpointName(g.Key), string(rec))).
		Commit()
	if err != nil {
		return writeErr("checkpoint", err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("etcd: checkpoint %s: %w: key %s is gone", g, fenced.ErrNotHeld, e.etcdKey)
	}
	return nil
}

// ReadCheckpoint implements driver.Checkpointer with one linearizable read.
func (d *Driver) ReadCheckpoint(ctx context.Context, key string) ([]byte, uint64, error) {
	resp, err := d.cli.Get(ctx, d.checkpointName(key))
	if err != nil {
		return nil, 0, readErr("read checkpoint", err)
	}
	if len(resp.Kvs) == 0 {
		return nil, 0, nil
	}
	rec := resp.Kvs[0].Value
	if len(rec) < 8 {
		return nil, 0, fmt.Errorf("etcd: read checkpoint %q: %w", key,
			errors.New("record shorter than its fence: not written by fenced"))
	}
	return append([]byte{}, rec[8:]...), binary.BigEndian.Uint64(rec), nil
}
