package fenceddynamodb

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/core/token"
)

// info describes an item read at at. A grant counts as held until this
// driver has watched it unchanged for its TTL; Remaining is what is left
// of that watch.
func (d *Driver) info(key string, it leaseItem, at time.Time) driver.LeaseInfo {
	info := driver.LeaseInfo{Key: key, Fence: it.fence}
	left := d.obs.see(key, it, at)
	if it.owner != "" && left > 0 {
		info.Held = true
		token.Set(&info, it.owner)
		info.Remaining = left
	}
	return info
}

// Inspect implements driver.Driver with one consistent GetItem. A key
// granted by another process is reported held, with Remaining the time
// until this driver may take it over (a whole TTL at the first look).
func (d *Driver) Inspect(ctx context.Context, key string) (driver.LeaseInfo, error) {
	if err := d.checkOpen(); err != nil {
		return driver.LeaseInfo{}, err
	}
	it, found, at, err := d.read(ctx, "inspect", key)
	if err != nil {
		return driver.LeaseInfo{Key: key}, err
	}
	if !found {
		return driver.LeaseInfo{Key: key}, fmt.Errorf("%s: %w", key, fenced.ErrNotFound)
	}
	return d.info(key, it, at), nil
}

// List implements driver.Driver with a consistent Scan of the table (there
// is no index on keys across partitions), filtered to lease items with an
// owner whose key starts with prefix. Keys are sorted byte-wise.
func (d *Driver) List(ctx context.Context, prefix string) ([]driver.LeaseInfo, error) {
	if err := d.checkOpen(); err != nil {
		return nil, err
	}
	filter := "#r = :lease AND attribute_exists(#o)"
	names := map[string]string{"#r": attrRecord, "#o": attrOwner}
	vals := map[string]types.AttributeValue{":lease": str(recordLease)}
	if prefix != "" {
		filter += " AND begins_with(#k, :prefix)"
		names["#k"] = attrKey
		vals[":prefix"] = str(prefix)
	}
	var out []driver.LeaseInfo
	err := d.scan(ctx, "list", prefix, filter, names, vals, func(item map[string]types.AttributeValue, at time.Time) error {
		key, _, err := getS(item, attrKey)
		if err != nil {
			return itemError(key, err)
		}
		it, err := decodeLease(key, item)
		if err != nil {
			return err
		}
		if info := d.info(key, it, at); info.Held {
			out = append(out, info)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// scan runs a consistent Scan with filter to its end, passing every item
// and the time its page arrived to fn.
func (d *Driver) scan(ctx context.Context, op, what, filter string, names map[string]string, vals map[string]types.AttributeValue,
	fn func(map[string]types.AttributeValue, time.Time) error) error {
	var start map[string]types.AttributeValue
	for {
		var out *dynamodb.ScanOutput
		_, err := d.call(ctx, func(ctx context.Context) (err error) {
			out, err = d.client.Scan(ctx, &dynamodb.ScanInput{
				TableName:                 aws.String(d.table),
				ConsistentRead:            aws.Bool(true),
				FilterExpression:          aws.String(filter),
				ExpressionAttributeNames:  names,
				ExpressionAttributeValues: vals,
				ExclusiveStartKey:         start,
			}, noRetry)
			return err
		})
		at := d.clk.Now()
		if err != nil {
			return d.classify(op, what, false, false, err)
		}
		for _, item := range out.Items {
			if err := fn(item, at); err != nil {
				return err
			}
		}
		if len(out.LastEvaluatedKey) == 0 {
			return nil
		}
		start = out.LastEvaluatedKey
	}
}

// Break implements driver.Driver and keeps an audit record. It reads the
// item. It ends that grant with one UpdateItem conditional on its owner and
// fence, which also stores the record on the item (last_break). Then it
// writes the record as an audit item of its own. The previous break's record
// is written as an audit item again first (in case a crash lost it) before
// last_break is overwritten. Any recorded owner can be broken, even one this
// driver would already be allowed to take over.
func (d *Driver) Break(ctx context.Context, key string, reason, by string) (driver.LeaseInfo, error) {
	if err := d.checkOpen(); err != nil {
		return driver.LeaseInfo{}, err
	}
	for attempt := 0; attempt < 2; attempt++ {
		it, found, at, err := d.read(ctx, "break", key)
		if err != nil {
			return driver.LeaseInfo{Key: key}, err
		}
		if !found || it.owner == "" {
			return driver.LeaseInfo{Key: key}, fmt.Errorf("%s: %w", key, fenced.ErrNotHeld)
		}
		if it.lastBreak != nil {
			if err := d.putAudit(ctx, key, *it.lastBreak); err != nil {
				return driver.LeaseInfo{Key: key}, err
			}
		}
		info := driver.LeaseInfo{Key: key, Held: true, Fence: it.fence, Remaining: max(d.obs.see(key, it, at), 0)}
		token.Set(&info, it.owner)
		rec := driver.BreakRecord{
			Time: time.Now().UTC().Truncate(time.Microsecond), Key: key, Fence: it.fence,
			Owner: info.Owner, Reason: reason, By: by,
		}
		_, refused, err := d.updateGrant(ctx, "break", key, driver.Grant{Key: key, Owner: it.owner, Fence: it.fence},
			"SET #v = #v + :one, #b = :rec REMOVE #o, #t",
			map[string]types.AttributeValue{":rec": &types.AttributeValueMemberM{Value: encodeBreak(rec)}},
			map[string]string{"#b": attrBreak})
		if err != nil {
			return driver.LeaseInfo{Key: key}, err
		}
		if refused {
			continue // released, renewed by a new grant or taken over meanwhile: look again
		}
		d.obs.forget(key)
		// The record is already safe on the lease item; the audit item is
		// written again before the next break if this fails.
		_ = d.putAudit(ctx, key, rec)
		return info, nil
	}
	return driver.LeaseInfo{Key: key}, fmt.Errorf(
		"dynamodb: break %q: the grant changed twice while it was being broken; nothing was broken: %w",
		key, fenced.ErrUnavailable)
}

// encodeBreak encodes a break record as a map attribute (empty strings are
// left out).
func encodeBreak(r driver.BreakRecord) map[string]types.AttributeValue {
	m := map[string]types.AttributeValue{
		attrAt:    num(uint64(r.Time.UnixMicro())),
		attrFence: num(r.Fence),
	}
	for name, v := range map[string]string{attrOwner: r.Owner, attrReason: r.Reason, attrBy: r.By} {
		if v != "" {
			m[name] = str(v)
		}
	}
	return m
}

func decodeBreak(key string, m map[string]types.AttributeValue) (driver.BreakRecord, error) {
	r := driver.BreakRecord{Key: key}
	at, _, err := getN(m, attrAt)
	if err == nil {
		r.Fence, _, err = getN(m, attrFence)
	}
	if err == nil {
		r.Owner, _, err = getS(m, attrOwner)
	}
	if err == nil {
		r.Reason, _, err = getS(m, attrReason)
	}
	if err == nil {
		r.By, _, err = getS(m, attrBy)
	}
	if err != nil {
		return r, itemError(key, fmt.Errorf("break record: %v", err))
	}
	r.Time = time.UnixMicro(int64(at)).UTC()
	return r, nil
}

func breakRecordName(fence uint64) string { return fmt.Sprintf("%s%020d", breakPrefix, fence) }

// putAudit writes r as the audit item of key's break of r.Fence. A grant
// is broken at most once, so the item's key identifies the break and
// writing it again changes nothing.
func (d *Driver) putAudit(ctx context.Context, key string, r driver.BreakRecord) error {
	item := encodeBreak(r)
	item[attrKey] = str(key)
	item[attrRecord] = str(breakRecordName(r.Fence))
	sent, err := d.call(ctx, func(ctx context.Context) error {
		_, err := d.client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(d.table), Item: item}, noRetry)
		return err
	})
	if err != nil {
		return d.classify("break audit", key, true, sent, err)
	}
	return nil
}

// Breaks implements driver.BreakLogger. For one key it is a consistent
// Query of its audit items plus a read of its lease item. For every key, a
// consistent Scan. Records are sorted by time (then key and fence).
func (d *Driver) Breaks(ctx context.Context, key string) ([]driver.BreakRecord, error) {
	if err := d.checkOpen(); err != nil {
		return nil, err
	}
	type id struct {
		key   string
		fence uint64
	}
	recs := map[id]driver.BreakRecord{}
	add := func(item map[string]types.AttributeValue, _ time.Time) error {
		k, _, err := getS(item, attrKey)
		if err != nil {
			return itemError(k, err)
		}
		rec, _, err := getS(item, attrRecord)
		if err != nil {
			return itemError(k, err)
		}
		var r driver.BreakRecord
		switch {
		case strings.HasPrefix(rec, breakPrefix):
			if r, err = decodeBreak(k, item); err != nil {
				return err
			}
		case rec == recordLease:
			it, err := decodeLease(k, item)
			if err != nil || it.lastBreak == nil {
				return err
			}
			r = *it.lastBreak
		default:
			return nil
		}
		recs[id{r.Key, r.Fence}] = r
		return nil
	}
	names := map[string]string{"#r": attrRecord}
	vals := map[string]types.AttributeValue{":brk": str(breakPrefix)}
	if key == "" {
		names["#b"] = attrBreak
		if err := d.scan(ctx, "breaks", "", "begins_with(#r, :brk) OR attribute_exists(#b)", names, vals, add); err != nil {
			return nil, err
		}
	} else {
		names["#k"] = attrKey
		vals[":k"] = str(key)
		var start map[string]types.AttributeValue
		for {
			var out *dynamodb.QueryOutput
			_, err := d.call(ctx, func(ctx context.Context) (err error) {
				out, err = d.client.Query(ctx, &dynamodb.QueryInput{
					TableName:                 aws.String(d.table),
					ConsistentRead:            aws.Bool(true),
					KeyConditionExpression:    aws.String("#k = :k AND begins_with(#r, :brk)"),
					ExpressionAttributeNames:  names,
					ExpressionAttributeValues: vals,
					ExclusiveStartKey:         start,
				}, noRetry)
				return err
			})
			if err != nil {
				return nil, d.classify("breaks", key, false, false, err)
			}
			for _, item := range out.Items {
				if err := add(item, time.Time{}); err != nil {
					return nil, err
				}
			}
			if len(out.LastEvaluatedKey) == 0 {
				break
			}
			start = out.LastEvaluatedKey
		}
		it, found, _, err := d.read(ctx, "breaks", key)
		if err != nil {
			return nil, err
		}
		if found && it.lastBreak != nil {
			recs[id{key, it.lastBreak.Fence}] = *it.lastBreak
		}
	}
	out := make([]driver.BreakRecord, 0, len(recs))
	for _, r := range recs {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if !a.Time.Equal(b.Time) {
			return a.Time.Before(b.Time)
		}
		if a.Key != b.Key {
			return a.Key < b.Key
		}
		return a.Fence < b.Fence
	})
	return out, nil
}
