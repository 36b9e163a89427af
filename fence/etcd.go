package fence

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fenced-dev/fenced"
)

// DefaultEtcdFencePrefix prefixes the keys in which the etcd guard records
// each resource's newest fence.
const DefaultEtcdFencePrefix = "fenced/fence/"

// Etcd guards resources stored in etcd. For each resource it keeps one key,
// FencePrefix + resource, holding the newest fence and its owner (encoded
// as a 20-digit zero-padded fence, a space and the owner, so etcd's byte-wise
// comparison orders fences numerically). A guarded write is one etcd
// transaction that compares that key and applies the caller's operations
// only when the fence admits the writer, so it is atomic with the write and
// linearizable like every etcd transaction.
//
// Never delete the fence keys: that would forget the fences.
type Etcd struct {
	kv     clientv3.KV
	prefix string
	hooks  fenced.Hooks
}

// EtcdOptions configure an etcd guard. nil gives the defaults.
type EtcdOptions struct {
	// FencePrefix prefixes fence keys; default DefaultEtcdFencePrefix.
	FencePrefix string
	// Hooks receive a StaleWrite event for every refused stale write.
	Hooks fenced.Hooks
}

// NewEtcd returns a guard using kv (a *clientv3.Client or any clientv3.KV).
// opts may be nil.
func NewEtcd(kv clientv3.KV, opts *EtcdOptions) (*Etcd, error) {
	if kv == nil {
		return nil, errors.New("fence: NewEtcd: client is nil")
	}
	g := &Etcd{kv: kv, prefix: DefaultEtcdFencePrefix}
	if opts != nil {
		if opts.FencePrefix != "" {
			g.prefix = opts.FencePrefix
		}
		g.hooks = opts.Hooks
	}
	return g, nil
}

// FenceKey returns the key recording resource's fence.
func (g *Etcd) FenceKey(resource string) string { return g.prefix + resource }

func encodeEtcd(t Token) string { return fmt.Sprintf("%020d %s", t.Fence, t.Owner) }

func decodeEtcd(v string) (uint64, string, error) {
	if len(v) < 21 || v[20] != ' ' {
		return 0, "", fmt.Errorf("%w: fence key holds %q, not a fence", ErrSchema, v)
	}
	f, err := strconv.ParseUint(v[:20], 10, 64)
	if err != nil || f > MaxFence {
		return 0, "", fmt.Errorf("%w: fence key holds %q, not a fence", ErrSchema, v)
	}
	return f, v[21:], nil
}

// EtcdWrite is a guarded etcd transaction.
type EtcdWrite struct {
	// If are the write's own preconditions; when one fails the result is
	// PreconditionFailed.
	If []clientv3.Cmp
	// Then are the operations to apply. They must not touch the fence key.
	Then []clientv3.Op
}

// Claim records t's fence for resource before the holder does anything
// else; see SQL.Claim.
func (g *Etcd) Claim(ctx context.Context, resource string, t Token) (Result, error) {
	return g.Write(ctx, resource, t, EtcdWrite{})
}

// Write applies w in one transaction if resource's recorded fence admits t
// (newer, or equal with the same owner) and w.If holds, recording t's fence
// and owner. A resource never written has fence 0. Errors: ErrInvalidToken
// for a bad token, ErrSchema when the fence key holds something else, and
// etcd errors wrapped (an error after sending may mean the transaction was
// applied; read before retrying).
func (g *Etcd) Write(ctx context.Context, resource string, t Token, w EtcdWrite) (Result, error) {
	if err := t.Validate(); err != nil {
		return Result{}, fmt.Errorf("fence: etcd write %q: %w", resource, err)
	}
	if resource == "" {
		return Result{}, errors.New("fence: etcd write: resource is empty")
	}
	fk := g.FenceKey(resource)
	val := encodeEtcd(t)
	then := append([]clientv3.Op{clientv3.OpPut(fk, val)}, w.Then...)
	cond := func(c clientv3.Cmp) []clientv3.Cmp { return append([]clientv3.Cmp{c}, w.If...) }
	// Three ways to be admitted, tried in one request: no fence recorded; an
	// older fence (any owner); the same fence and owner.
	same := clientv3.OpTxn(cond(clientv3.Compare(clientv3.Value(fk), "=", val)), then, []clientv3.Op{clientv3.OpGet(fk)})
	// The lower bound keeps a value that is not a fence (which may sort
	// below every fence) from passing as an older one.
	older := clientv3.OpTxn(append(cond(clientv3.Compare(clientv3.Value(fk), "<", fmt.Sprintf("%020d ", t.Fence))),
		clientv3.Compare(clientv3.Value(fk), ">", fmt.Sprintf("%020d", 0))), then, []clientv3.Op{same})
	resp, err := g.kv.Txn(ctx).If(cond(clientv3.Compare(clientv3.Version(fk), "=", 0))...).Then(then...).Else(older).Commit()
	if err != nil {
		return Result{}, fmt.Errorf("fence: etcd write %q: %w", resource, err)
	}
	applied := resp.Succeeded
	for depth := 0; !applied && depth < 2; depth++ {
		if len(resp.Responses) != 1 || resp.Responses[0].GetResponseTxn() == nil {
			return Result{}, fmt.Errorf("fence: etcd write %q: unexpected transaction response", resource)
		}
		resp = (*clientv3.TxnResponse)(resp.Responses[0].GetResponseTxn())
		applied = resp.Succeeded
	}
	if applied {
		return Result{Outcome: Applied, Current: t.Fence}, nil
	}
	if len(resp.Responses) != 1 || resp.Responses[0].GetResponseRange() == nil {
		return Result{}, fmt.Errorf("fence: etcd write %q: unexpected transaction response", resource)
	}
	var cur uint64
	var owner string
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		if cur, owner, err = decodeEtcd(string(kvs[0].Value)); err != nil {
			return Result{}, fmt.Errorf("fence: etcd write %q: %w", resource, err)
		}
	}
	r := classify(t, cur, owner)
	report(g.hooks, t, r, resource)
	return r, nil
}

// Current returns the fence and owner recorded for resource (0 and "" if
// none).
func (g *Etcd) Current(ctx context.Context, resource string) (uint64, string, error) {
	resp, err := g.kv.Get(ctx, g.FenceKey(resource))
	if err != nil {
		return 0, "", fmt.Errorf("fence: etcd read %q: %w", resource, err)
	}
	if len(resp.Kvs) == 0 {
		return 0, "", nil
	}
	f, o, err := decodeEtcd(string(resp.Kvs[0].Value))
	if err != nil {
		return 0, "", fmt.Errorf("fence: etcd read %q: %w", resource, err)
	}
	return f, o, nil
}
