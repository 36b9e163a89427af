// Package etcdfence is the resource-side guard of package fence for data
// kept in etcd. A guarded write is one etcd transaction that compares the
// resource's recorded fence. It applies the caller's operations only when
// the token's fence admits the writer.
//
//	guard, _ := etcdfence.New(cli, nil)
//	res, err := guard.Write(ctx, "invoice/72", fence.From(lease), etcdfence.Write{Then: ops})
//
// It lives in its own package so that package fence does not link etcd's
// client.
package etcdfence

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fence"
)

// DefaultFencePrefix prefixes the keys in which the etcd guard records
// each resource's newest fence.
const DefaultFencePrefix = "fenced/fence/"

// Guard guards resources stored in etcd. For each resource it keeps one key,
// FencePrefix + resource. The key holds the lease key the resource is bound
// to, the newest fence and its owner. They are encoded as the lease key, a
// newline, a 20-digit zero-padded fence, a space and the owner. So etcd's
// byte-wise comparison orders the fences of one lease key numerically. A
// guarded write is one etcd transaction that compares that key and applies
// the caller's operations only when the fence admits the writer. So it is
// atomic with the write and linearizable like every etcd transaction.
//
// The first admitted write binds a resource to its token's lease key. A
// token for any other key is then refused with fence.ErrWrongKey whatever its
// fence, because fences are only comparable within one key. A fence key
// written before guards recorded the lease key ("fence owner", no newline)
// is bound by its next admitted write. Options.LeaseKey also checks the
// key before the first write.
//
// Never delete the fence keys: that would forget the fences.
type Guard struct {
	kv     clientv3.KV
	prefix string
	checks fence.Prechecks
	hook   func(fenced.Event)
}

// Options configure an etcd guard. nil gives the defaults.
type Options struct {
	// FencePrefix prefixes fence keys; default DefaultFencePrefix.
	FencePrefix string
	// LeaseKey, when set, returns the lease key that guards resource; a
	// token for another key is refused with fence.ErrWrongKey before anything is
	// sent, even for a resource not yet bound.
	LeaseKey func(resource string) string
	// Check, when set, must accept every token before it is compared (for
	// example a *fence.Verifier for signed tokens); a refusal is returned as the
	// error and nothing is sent.
	Check fence.Checker
	// Hook receives an EventStaleWrite for every refused stale write
	// (when nil, the hook of the client that issued the token).
	Hook func(fenced.Event)
}

// New returns a guard using kv (a *clientv3.Client or any clientv3.KV).
// opts may be nil.
func New(kv clientv3.KV, opts *Options) (*Guard, error) {
	if kv == nil {
		return nil, errors.New("fence: New: client is nil")
	}
	g := &Guard{kv: kv, prefix: DefaultFencePrefix}
	if opts != nil {
		if opts.FencePrefix != "" {
			g.prefix = opts.FencePrefix
		}
		g.checks = fence.Prechecks{LeaseKey: opts.LeaseKey, Check: opts.Check}
		g.hook = opts.Hook
	}
	return g, nil
}

// FenceKey returns the key recording resource's fence.
func (g *Guard) FenceKey(resource string) string { return g.prefix + resource }

// etcdFencePart is the part of a fence key's value that follows the lease
// key and its newline: the zero-padded fence, a space and the owner.
func etcdFencePart(fence uint64, owner string) string { return fmt.Sprintf("%020d %s", fence, owner) }

func encodeEtcd(t fence.Token) string { return t.Key + "\n" + etcdFencePart(t.Fence, t.Owner) }

// etcdRecord is a decoded fence key. legacy marks the format without a
// lease key.
type etcdRecord struct {
	key    string
	fence  uint64
	owner  string
	legacy bool
}

func decodeEtcd(v string) (etcdRecord, error) {
	var r etcdRecord
	key, rest, found := strings.Cut(v, "\n")
	if found {
		r.key = key
	} else {
		rest, r.legacy = v, true
	}
	if len(rest) < 21 || rest[20] != ' ' || (found && fenced.ValidateKey(key) != nil) {
		return etcdRecord{}, fmt.Errorf("%w: fence key holds %q, not a fence", fence.ErrSchema, v)
	}
	f, err := strconv.ParseUint(rest[:20], 10, 64)
	if err != nil || f > fence.MaxFence {
		return etcdRecord{}, fmt.Errorf("%w: fence key holds %q, not a fence", fence.ErrSchema, v)
	}
	r.fence, r.owner = f, rest[21:]
	return r, nil
}

// Write is a guarded etcd transaction.
type Write struct {
	// If are the write's own preconditions; when one fails the result is
	// fence.PreconditionFailed.
	If []clientv3.Cmp
	// Then are the operations to apply. They must not touch the fence key.
	Then []clientv3.Op
}

// Claim records t's fence for resource before the holder does anything
// else; see SQL.Claim.
func (g *Guard) Claim(ctx context.Context, resource string, t fence.Token) (fence.Result, error) {
	return g.Write(ctx, resource, t, Write{})
}

// Write applies w in one transaction if resource is bound to t's lease key
// (or to none yet), its recorded fence admits t (newer, or equal with the
// same owner) and w.If holds. It records t's key, fence and owner. A
// resource never written has fence 0. Errors: fence.ErrInvalidToken for a
// bad token; fence.ErrWrongKey for a token of another lease key. The
// fence.Checker's error when it refuses t; fence.ErrSchema when the fence
// key holds something else. etcd errors are wrapped. An error after sending
// may mean the transaction was applied: read before retrying.
func (g *Guard) Write(ctx context.Context, resource string, t fence.Token, w Write) (fence.Result, error) {
	if resource == "" {
		return fence.Result{}, errors.New("fence: etcd write: resource is empty")
	}
	if err := g.checks.Run(ctx, resource, t); err != nil {
		return fence.Result{}, fmt.Errorf("fence: etcd write %q: %w", resource, err)
	}
	fk := g.FenceKey(resource)
	val := encodeEtcd(t)
	then := append([]clientv3.Op{clientv3.OpPut(fk, val)}, w.Then...)
	cond := func(c ...clientv3.Cmp) []clientv3.Cmp { return append(c, w.If...) }
	// A fence key written before keys were recorded is bound by the first
	// admitted write, replacing exactly the value read (so a concurrent
	// change sends us round again). The loop ends: after the first
	// replacement no legacy value is left.
	for attempt := 0; ; attempt++ {
		// Three ways to be admitted, tried in one request: no fence
		// recorded; an older fence of the same lease key (any owner); the
		// same key, fence and owner. Both bounds of the range start with
		// t.Key and a newline, which no key contains, so only values of
		// that lease key fall between them; the lower bound also keeps a
		// value that is not a fence from passing as an older one.
		prefix := t.Key + "\n"
		same := clientv3.OpTxn(cond(clientv3.Compare(clientv3.Value(fk), "=", val)), then, []clientv3.Op{clientv3.OpGet(fk)})
		older := clientv3.OpTxn(cond(
			clientv3.Compare(clientv3.Value(fk), "<", prefix+fmt.Sprintf("%020d ", t.Fence)),
			clientv3.Compare(clientv3.Value(fk), ">", prefix+fmt.Sprintf("%020d", 0))), then, []clientv3.Op{same})
		resp, err := g.kv.Txn(ctx).If(cond(clientv3.Compare(clientv3.Version(fk), "=", 0))...).Then(then...).Else(older).Commit()
		if err != nil {
			return fence.Result{}, fmt.Errorf("fence: etcd write %q: %w", resource, err)
		}
		applied, cur, err := etcdOutcome(resp, 2)
		if err != nil {
			return fence.Result{}, fmt.Errorf("fence: etcd write %q: %w", resource, err)
		}
		if applied {
			return fence.Result{Outcome: fence.Applied, Current: t.Fence}, nil
		}
		var rec etcdRecord
		if cur != nil {
			if rec, err = decodeEtcd(*cur); err != nil {
				return fence.Result{}, fmt.Errorf("fence: etcd write %q: %w", resource, err)
			}
		}
		if cur != nil && !rec.legacy {
			if err := fence.CheckKey(rec.key, t.Key); err != nil {
				return fence.Result{}, fmt.Errorf("fence: etcd write %q: %w", resource, err)
			}
		}
		if cur != nil && rec.legacy && t.Admits(rec.fence, rec.owner) {
			resp, err := g.kv.Txn(ctx).If(cond(clientv3.Compare(clientv3.Value(fk), "=", *cur))...).
				Then(then...).Else(clientv3.OpGet(fk)).Commit()
			if err != nil {
				return fence.Result{}, fmt.Errorf("fence: etcd write %q: %w", resource, err)
			}
			applied, now, err := etcdOutcome(resp, 0)
			switch {
			case err != nil:
				return fence.Result{}, fmt.Errorf("fence: etcd write %q: %w", resource, err)
			case applied:
				return fence.Result{Outcome: fence.Applied, Current: t.Fence}, nil
			case now == nil || *now != *cur:
				if attempt < 8 {
					continue // changed since read: decide again
				}
				return fence.Result{}, fmt.Errorf("fence: etcd write %q: fence key keeps changing; nothing written", resource)
			}
			// Unchanged, so w.If did not hold.
		}
		r := fence.Refusal(t, rec.fence, rec.owner)
		fence.ReportStale(g.hook, t, r, resource)
		return r, nil
	}
}

// etcdOutcome follows the Else branches of a transaction nested depth
// levels deep and reports whether one of them applied, or else the value
// read by the innermost Else (nil when the key does not exist).
func etcdOutcome(resp *clientv3.TxnResponse, depth int) (applied bool, value *string, err error) {
	for d := 0; !resp.Succeeded && d < depth; d++ {
		if len(resp.Responses) != 1 || resp.Responses[0].GetResponseTxn() == nil {
			return false, nil, errors.New("unexpected transaction response")
		}
		resp = (*clientv3.TxnResponse)(resp.Responses[0].GetResponseTxn())
	}
	if resp.Succeeded {
		return true, nil, nil
	}
	if len(resp.Responses) != 1 || resp.Responses[0].GetResponseRange() == nil {
		return false, nil, errors.New("unexpected transaction response")
	}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		v := string(kvs[0].Value)
		return false, &v, nil
	}
	return false, nil, nil
}

// Current returns the fence and owner recorded for resource (0 and "" if
// none).
func (g *Guard) Current(ctx context.Context, resource string) (uint64, string, error) {
	resp, err := g.kv.Get(ctx, g.FenceKey(resource))
	if err != nil {
		return 0, "", fmt.Errorf("fence: etcd read %q: %w", resource, err)
	}
	if len(resp.Kvs) == 0 {
		return 0, "", nil
	}
	rec, err := decodeEtcd(string(resp.Kvs[0].Value))
	if err != nil {
		return 0, "", fmt.Errorf("fence: etcd read %q: %w", resource, err)
	}
	return rec.fence, rec.owner, nil
}
