package rediskit

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/core/token"
	"github.com/redis/go-redis/v9"
)

// ScanAll returns the keys matching pattern, scanning every primary of a
// Cluster client.
func ScanAll(ctx context.Context, c redis.UniversalClient, pattern string) ([]string, error) {
	scan := func(ctx context.Context, c redis.Cmdable) ([]string, error) {
		var out []string
		it := c.Scan(ctx, 0, pattern, 1000).Iterator()
		for it.Next(ctx) {
			out = append(out, it.Val())
		}
		return out, it.Err()
	}
	cc, ok := c.(*redis.ClusterClient)
	if !ok {
		names, err := scan(ctx, c)
		return names, Classify(err, false)
	}
	var mu sync.Mutex
	var all []string
	err := cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		names, err := scan(ctx, n)
		mu.Lock()
		all = append(all, names...)
		mu.Unlock()
		return err
	})
	return all, Classify(err, false)
}

// ReadGrants reads the lock keys names in one pipeline and returns the
// unexpired grants among them, sorted by key. Values fenced did not write
// are skipped.
func ReadGrants(ctx context.Context, c redis.UniversalClient, l Layout, names []string) ([]driver.LeaseInfo, error) {
	if len(names) == 0 {
		return nil, nil
	}
	pipe := c.Pipeline()
	gets := make([]*redis.StringCmd, len(names))
	ttls := make([]*redis.DurationCmd, len(names))
	for i, n := range names {
		gets[i] = pipe.Get(ctx, n)
		ttls[i] = pipe.PTTL(ctx, n)
	}
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
		if _, ok := err.(redis.Error); !ok {
			return nil, Classify(err, false)
		}
	}
	var out []driver.LeaseInfo
	for i, n := range names {
		key, ok := l.KeyOfLock(n)
		v, err := gets[i].Result()
		if !ok || err != nil {
			continue
		}
		f, o, ok := ParseValue(v)
		ttl := ttls[i].Val()
		if !ok || ttl <= 0 && ttl != -1 {
			continue
		}
		info := driver.LeaseInfo{Key: key, Held: true, Fence: f, Remaining: max(ttl, 0)}
		token.Set(&info, o)
		out = append(out, info)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// BreakReply interprets the reply of the Break script.
func BreakReply(key string, k Keys, res []any) (driver.LeaseInfo, error) {
	info := driver.LeaseInfo{Key: key}
	if len(res) == 0 {
		return info, fmt.Errorf("break %q: unexpected script reply", key)
	}
	switch st, _ := res[0].(int64); st {
	case 0:
		return info, fmt.Errorf("break %q: %w: no current grant", key, fenced.ErrNotHeld)
	case StatusForeign:
		return info, fmt.Errorf("break %q: %w", key, ForeignError(k.Lock))
	}
	if len(res) < 4 {
		return info, fmt.Errorf("break %q: unexpected script reply", key)
	}
	fs, _ := res[1].(string)
	info.Fence, _ = strconv.ParseUint(fs, 10, 64)
	info.Owner, _ = res[2].(string)
	if len(res) > 5 {
		full, _ := res[5].(string)
		token.Set(&info, full)
	}
	pttl, _ := res[3].(int64)
	info.Held, info.Remaining = true, PTTL(pttl)
	return info, nil
}

// ReadBreaks returns the break records of key ("" for every key), oldest
// first. Record times come from the stream IDs, that is the server's
// clock.
func ReadBreaks(ctx context.Context, c redis.UniversalClient, l Layout, key string) ([]driver.BreakRecord, error) {
	var streams []string
	if key != "" {
		streams = []string{l.Keys(key).Audit}
	} else {
		var err error
		if streams, err = ScanAll(ctx, c, l.AuditPattern()); err != nil {
			return nil, err
		}
	}
	var out []driver.BreakRecord
	for _, s := range streams {
		k, ok := l.KeyOfAudit(s)
		if !ok {
			continue
		}
		msgs, err := c.XRange(ctx, s, "-", "+").Result()
		if err != nil {
			if strings.Contains(err.Error(), "WRONGTYPE") {
				return nil, ForeignError(s)
			}
			return nil, Classify(err, false)
		}
		for _, m := range msgs {
			out = append(out, breakRecord(k, m))
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Time.Before(out[j].Time) })
	return out, nil
}

func breakRecord(key string, m redis.XMessage) driver.BreakRecord {
	r := driver.BreakRecord{Key: key}
	if ms, _, ok := strings.Cut(m.ID, "-"); ok {
		if n, err := strconv.ParseInt(ms, 10, 64); err == nil {
			r.Time = time.UnixMilli(n)
		}
	}
	str := func(f string) string { s, _ := m.Values[f].(string); return s }
	r.Fence, _ = strconv.ParseUint(str("fence"), 10, 64)
	r.Owner, r.Reason, r.By = str("owner"), str("reason"), str("by")
	return r
}
