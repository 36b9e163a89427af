package fencedredlock

// Admin reads and breaks, merged across nodes.

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/backend/rediskit"
	"github.com/fenced-dev/fenced/internal/core/token"
	"github.com/redis/go-redis/v9"
)

// view is one node's state of a key.
type view struct {
	value   string
	held    bool
	pttl    int64
	counter uint64
	hasCtr  bool
}

// Inspect implements driver.Driver: the key is held if a majority of nodes
// hold the same grant. Remaining is the time left on the majority.
func (d *Driver) Inspect(ctx context.Context, key string) (driver.LeaseInfo, error) {
	if err := d.usable(); err != nil {
		return driver.LeaseInfo{}, err
	}
	k := d.layout.Keys(key)
	rs := fanout(ctx, d, d.opts.Budget, func(ctx context.Context, c redis.UniversalClient) (view, error) {
		res, err := rediskit.Inspect.Run(ctx, c, []string{k.Lock, k.Fence}).Slice()
		if err != nil || len(res) != 3 {
			return view{}, err
		}
		var v view
		v.value, v.held = res[0].(string)
		v.pttl, _ = res[1].(int64)
		if s, ok := res[2].(string); ok {
			n, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				return v, fmt.Errorf("%w", rediskit.ForeignError(k.Fence))
			}
			v.counter, v.hasCtr = n, true
		}
		return v, nil
	}, nil, nil)
	info := driver.LeaseInfo{Key: key}
	answered, seen := 0, false
	byValue := map[string][]int64{}
	var errs []error
	for _, r := range rs {
		if r.err != nil {
			if errors.Is(r.err, ErrForeignValue) || strings.Contains(r.err.Error(), "WRONGTYPE") {
				return info, fmt.Errorf("redlock: inspect %q: %s: %w", key, d.nodes[r.node].name, d.nodeErr(r.err, false, k))
			}
			errs = append(errs, fmt.Errorf("%s: %w", d.nodes[r.node].name, rediskit.Classify(r.err, false)))
			continue
		}
		answered++
		v := r.val
		seen = seen || v.held || v.hasCtr
		info.Fence = max(info.Fence, v.counter)
		if v.held {
			if _, _, ok := rediskit.ParseValue(v.value); !ok {
				return info, fmt.Errorf("redlock: inspect %q: %s: %w", key, d.nodes[r.node].name, rediskit.ForeignError(k.Lock))
			}
			byValue[v.value] = append(byValue[v.value], v.pttl)
		}
	}
	if answered < d.quorum {
		return info, fmt.Errorf("redlock: inspect %q: %w: %d of %d nodes answered: %w",
			key, fenced.ErrUnavailable, answered, len(d.nodes), errors.Join(errs...))
	}
	for v, ttls := range byValue {
		if len(ttls) >= d.quorum {
			f, o, _ := rediskit.ParseValue(v)
			sort.Slice(ttls, func(i, j int) bool { return ttls[i] > ttls[j] })
			info.Held, info.Fence, info.Remaining = true, f, rediskit.PTTL(ttls[d.quorum-1])
			token.Set(&info, o)
			return info, nil
		}
	}
	if !seen {
		return info, fmt.Errorf("redlock: inspect %q: %w", key, fenced.ErrNotFound)
	}
	return info, nil
}

// List implements driver.Driver: the keys a majority of nodes list with
// the same grant.
func (d *Driver) List(ctx context.Context, prefix string) ([]driver.LeaseInfo, error) {
	if err := d.usable(); err != nil {
		return nil, err
	}
	rs := fanout(ctx, d, 4*d.opts.Budget, func(ctx context.Context, c redis.UniversalClient) ([]driver.LeaseInfo, error) {
		names, err := rediskit.ScanAll(ctx, c, d.layout.LockPattern(prefix))
		if err != nil {
			return nil, err
		}
		return rediskit.ReadGrants(ctx, c, d.layout, names)
	}, nil, nil)
	type grantID struct {
		key, owner string
		fence      uint64
	}
	count := map[grantID][]driver.LeaseInfo{}
	lists, errs := answers(d, rs)
	answered := len(lists)
	for _, infos := range lists {
		for _, i := range infos {
			id := grantID{i.Key, i.Owner, i.Fence}
			count[id] = append(count[id], i)
		}
	}
	if answered < d.quorum {
		return nil, fmt.Errorf("redlock: list %q: %w: %d of %d nodes answered: %w",
			prefix, fenced.ErrUnavailable, answered, len(d.nodes), errors.Join(errs...))
	}
	var out []driver.LeaseInfo
	for _, is := range count {
		if len(is) >= d.quorum {
			sort.Slice(is, func(a, b int) bool { return is[a].Remaining > is[b].Remaining })
			out = append(out, is[d.quorum-1])
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// Break implements driver.Driver: it deletes the key's grant on every
// node, recording the break in each node's audit stream, and wakes
// waiters. Foreign values are left alone.
func (d *Driver) Break(ctx context.Context, key string, reason, by string) (driver.LeaseInfo, error) {
	if err := d.usable(); err != nil {
		return driver.LeaseInfo{}, err
	}
	k := d.layout.Keys(key)
	rs := fanout(ctx, d, d.opts.Budget, func(ctx context.Context, c redis.UniversalClient) ([]any, error) {
		return rediskit.Break.Run(ctx, c, []string{k.Lock, k.Audit}, k.Channel, reason, by, d.opts.AuditLen).Slice()
	}, nil, nil)
	var broken *driver.LeaseInfo
	var errs []error
	free := 0
	for _, r := range rs {
		if r.err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", d.nodes[r.node].name, d.nodeErr(r.err, true, k)))
			continue
		}
		info, err := rediskit.BreakReply(key, k, r.val)
		switch {
		case err == nil:
			if broken == nil || info.Remaining > broken.Remaining {
				broken = &info
			}
		case errors.Is(err, fenced.ErrNotHeld):
			free++
		default:
			errs = append(errs, fmt.Errorf("%s: %w", d.nodes[r.node].name, err))
		}
	}
	if broken != nil {
		return *broken, nil
	}
	if len(errs) > 0 && free < d.quorum {
		return driver.LeaseInfo{Key: key}, fmt.Errorf("redlock: break %q: %w", key, errors.Join(errs...))
	}
	return driver.LeaseInfo{Key: key}, fmt.Errorf("redlock: break %q: %w: no node holds a grant", key, fenced.ErrNotHeld)
}

// Breaks implements driver.BreakLogger: the records of every node that
// answers, one per break (a break recorded on several nodes is reported
// once, with its earliest time).
func (d *Driver) Breaks(ctx context.Context, key string) ([]driver.BreakRecord, error) {
	if err := d.usable(); err != nil {
		return nil, err
	}
	rs := fanout(ctx, d, 4*d.opts.Budget, func(ctx context.Context, c redis.UniversalClient) ([]driver.BreakRecord, error) {
		return rediskit.ReadBreaks(ctx, c, d.layout, key)
	}, nil, nil)
	type id struct {
		key, owner, reason, by string
		fence                  uint64
	}
	first := map[id]driver.BreakRecord{}
	lists, errs := answers(d, rs)
	answered := len(lists)
	for _, recs := range lists {
		for _, b := range recs {
			i := id{b.Key, b.Owner, b.Reason, b.By, b.Fence}
			if old, ok := first[i]; !ok || b.Time.Before(old.Time) {
				first[i] = b
			}
		}
	}
	if answered == 0 && len(errs) > 0 {
		return nil, fmt.Errorf("redlock: breaks %q: %w: %w", key, fenced.ErrUnavailable, errors.Join(errs...))
	}
	out := make([]driver.BreakRecord, 0, len(first))
	for _, b := range first {
		out = append(out, b)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Time.Before(out[j].Time) })
	return out, nil
}

// answers splits the replies of a fan-out into the values of the nodes
// that answered and the errors of the others, named by node.
func answers[T any](d *Driver, rs []reply[T]) (vals []T, errs []error) {
	for _, r := range rs {
		if r.err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", d.nodes[r.node].name, r.err))
			continue
		}
		vals = append(vals, r.val)
	}
	return vals, errs
}
