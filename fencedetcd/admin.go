package fencedetcd

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/backend/keyname"
	"github.com/fenced-dev/fenced/internal/core/token"
)

// setHolder records how an admin sees the owner of a waiter key: the
// fenced owner token shortened and digested, or the etcd lease of a
// foreign holder (etcdctl lock and concurrency.Mutex put an empty value),
// which has no digest.
func setHolder(info *driver.LeaseInfo, kv *mvccpb.KeyValue) {
	if len(kv.Value) > 0 {
		token.Set(info, string(kv.Value))
		return
	}
	info.Owner = fmt.Sprintf("lease:%x", kv.Lease)
}

// Inspect implements driver.Driver.
func (d *Driver) Inspect(ctx context.Context, key string) (driver.LeaseInfo, error) {
	name := d.LockName(key)
	resp, err := d.cli.Txn(ctx).Then(
		clientv3.OpGet(name+"/", clientv3.WithFirstCreate()...),
		clientv3.OpGet(d.recordKey(name)),
	).Commit()
	if err != nil {
		return driver.LeaseInfo{}, readErr("inspect", err)
	}
	info := driver.LeaseInfo{Key: key}
	if first := resp.Responses[0].GetResponseRange().Kvs; len(first) > 0 {
		kv := first[0]
		info.Held, info.Fence = true, uint64(kv.CreateRevision)
		setHolder(&info, kv)
		if kv.Lease != 0 {
			if ttl, err := d.cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease)); err == nil && ttl.TTL > 0 {
				info.Remaining = time.Duration(ttl.TTL) * time.Second
			}
		}
		return info, nil
	}
	rec := resp.Responses[1].GetResponseRange().Kvs
	if len(rec) == 0 {
		return info, fmt.Errorf("etcd: inspect %q: %w", key, fenced.ErrNotFound)
	}
	f, err := recordedFence(rec[0])
	if err != nil {
		return info, fmt.Errorf("etcd: inspect %q: %w", key, err)
	}
	info.Fence = f
	return info, nil
}

// List implements driver.Driver: one range read over the lock names that
// start with prefix. The oldest key of each name holds it.
func (d *Driver) List(ctx context.Context, prefix string) ([]driver.LeaseInfo, error) {
	start := d.prefix + keyname.EscapePrefix(prefix)
	resp, err := d.cli.Get(ctx, start, clientv3.WithPrefix())
	if err != nil {
		return nil, readErr("list", err)
	}
	holders := map[string]*mvccpb.KeyValue{}
	for _, kv := range resp.Kvs {
		rest := strings.TrimPrefix(string(kv.Key), d.prefix)
		i := strings.IndexByte(rest, '/')
		if i < 0 {
			continue // a fence record
		}
		k, ok := keyname.Unescape(rest[:i])
		if !ok || !strings.HasPrefix(k, prefix) {
			continue
		}
		if h, ok := holders[k]; !ok || kv.CreateRevision < h.CreateRevision {
			holders[k] = kv
		}
	}
	out := make([]driver.LeaseInfo, 0, len(holders))
	for k, kv := range holders {
		info := driver.LeaseInfo{Key: k, Held: true, Fence: uint64(kv.CreateRevision)}
		setHolder(&info, kv)
		out = append(out, info)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// Break implements driver.Driver: it deletes the holder's key (whoever put
// it, etcdctl included), which cancels the holder's lease through its loss
// watch and hands the lock to the next waiter.
func (d *Driver) Break(ctx context.Context, key string, reason, by string) (driver.LeaseInfo, error) {
	name := d.LockName(key)
	resp, err := d.cli.Get(ctx, name+"/", clientv3.WithFirstCreate()...)
	if err != nil {
		return driver.LeaseInfo{}, readErr("break", err)
	}
	if len(resp.Kvs) == 0 {
		return driver.LeaseInfo{Key: key}, fmt.Errorf("etcd: break %q: %w", key, fenced.ErrNotHeld)
	}
	kv := resp.Kvs[0]
	info := driver.LeaseInfo{Key: key, Held: true, Fence: uint64(kv.CreateRevision)}
	setHolder(&info, kv)
	tr, err := d.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(string(kv.Key)), "=", kv.CreateRevision)).
		Then(clientv3.OpDelete(string(kv.Key)), clientv3.OpPut(d.recordKey(name), fmt.Sprint(kv.CreateRevision))).
		Commit()
	if err != nil {
		return info, writeErr("break", err)
	}
	if !tr.Succeeded {
		return info, fmt.Errorf("etcd: break %q: %w: released meanwhile", key, fenced.ErrNotHeld)
	}
	return info, nil
}
