package fenceddynamodb

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/backend/leasetable"
	"github.com/fenced-dev/fenced/internal/core/ttlrule"
)

// leaseItem is a lease item as read from the table.
type leaseItem struct {
	owner          string // "" when free
	fence, version uint64
	ttl            time.Duration
	lastBreak      *driver.BreakRecord
}

// grantNames are the attribute names every grant expression uses.
func grantNames() map[string]string {
	return map[string]string{"#o": attrOwner, "#f": attrFence, "#v": attrVersion, "#t": attrTTL}
}

func (d *Driver) leaseKey(key string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{attrKey: str(key), attrRecord: str(recordLease)}
}

func str(s string) types.AttributeValue { return &types.AttributeValueMemberS{Value: s} }

func num(n uint64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatUint(n, 10)}
}

// millis is a TTL in whole milliseconds, the unit the item stores, by the
// one TTL rounding rule (ttlrule.Units: rounded up, never shortened).
func millis(ttl time.Duration) uint64 { return uint64(ttlrule.Units(ttl, time.Millisecond)) }

// TryAcquire implements driver.Driver. Uncontended it is one conditional
// UpdateItem. A refusal costs one consistent GetItem more on servers that
// do not return the refusing item, and a re-acquire by the holding owner
// one conditional UpdateItem more. A refusal is a *fenced.HeldError whose
// Remaining is the time until this driver may take the grant over (it has
// then watched the grant unchanged for its TTL).
func (d *Driver) TryAcquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	if err := d.checkOpen(); err != nil {
		return 0, err
	}
	if err := leasetable.CheckOwner(owner); err != nil {
		return 0, fmt.Errorf("dynamodb: acquire %q: %w", key, err)
	}
	for attempt := 0; ; attempt++ {
		it, found, granted, at, err := d.grant(ctx, key, owner, ttl)
		switch {
		case err != nil:
			return 0, err
		case granted:
			return it.fence, nil
		case !found || it.owner == "":
			// Released between the refused write and the read: try once
			// more, then report it held (the portable client polls again).
			if attempt == 0 {
				continue
			}
			return 0, leasetable.Held(key, 0)
		case it.owner == owner:
			return d.reconfirm(ctx, key, owner, it.fence, ttl)
		}
		left := d.obs.see(key, it, at)
		return 0, leasetable.Held(key, max(left, time.Millisecond))
	}
}

// grant sends the conditional grant. Refused, it returns the item that
// refused it (found false if there was none by the time it was read) and
// when that answer arrived.
func (d *Driver) grant(ctx context.Context, key, owner string, ttl time.Duration) (it leaseItem, found, granted bool,
	at time.Time, err error) {
	cond := "attribute_not_exists(#o)"
	vals := map[string]types.AttributeValue{":zero": num(0), ":one": num(1), ":owner": str(owner), ":ttl": num(millis(ttl))}
	if ob, ok := d.obs.ripe(key); ok {
		// Watched unchanged for its whole TTL: take it over, unless a
		// renewal (or anything else) has raised the version since.
		cond += " OR (#f = :of AND #v = :ov)"
		vals[":of"], vals[":ov"] = num(ob.fence), num(ob.version)
	}
	var out *dynamodb.UpdateItemOutput
	sent, err := d.call(ctx, func(ctx context.Context) (err error) {
		out, err = d.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName: aws.String(d.table),
			Key:       d.leaseKey(key),
			UpdateExpression: aws.String("SET #f = if_not_exists(#f, :zero) + :one, " +
				"#v = if_not_exists(#v, :zero) + :one, #o = :owner, #t = :ttl"),
			ConditionExpression:                 aws.String(cond),
			ExpressionAttributeNames:            grantNames(),
			ExpressionAttributeValues:           vals,
			ReturnValues:                        types.ReturnValueAllNew,
			ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
		}, noRetry)
		return err
	})
	at = d.clk.Now()
	if err == nil {
		if it, err = decodeLease(key, out.Attributes); err != nil {
			return it, true, false, at, err
		}
		d.obs.see(key, it, at)
		return it, true, true, at, nil
	}
	var ccf *types.ConditionalCheckFailedException
	if !errors.As(err, &ccf) {
		return it, false, false, at, d.classify("acquire", key, true, sent, err)
	}
	if len(ccf.Item) > 0 {
		it, err = decodeLease(key, ccf.Item)
		return it, true, false, at, err
	}
	it, found, at, err = d.read(ctx, "acquire", key)
	return it, found, false, at, err
}

// reconfirm is the idempotent re-acquire by the owner that holds key
// (typically a retry after an unknown outcome): it extends the grant with
// the same fence.
func (d *Driver) reconfirm(ctx context.Context, key, owner string, fence uint64, ttl time.Duration) (uint64, error) {
	_, refused, err := d.updateGrant(ctx, "acquire", key, driver.Grant{Key: key, Owner: owner, Fence: fence},
		"SET #v = #v + :one, #t = :ttl", map[string]types.AttributeValue{":ttl": num(millis(ttl))}, nil)
	if err != nil {
		return 0, err
	}
	if refused {
		// Released or broken since it was read.
		return 0, leasetable.Held(key, 0)
	}
	return fence, nil
}

// Renew implements driver.Driver: one UpdateItem conditional on owner and
// fence, which raises the version (so waiters watching the grant start
// their watch again) and sets the TTL. A grant nobody has taken over is
// still current, so it can be renewed even after its TTL has run out.
func (d *Driver) Renew(ctx context.Context, g driver.Grant) error {
	if err := d.checkOpen(); err != nil {
		return err
	}
	if err := ttlrule.Check(g); err != nil {
		return err
	}
	if g.Owner == "" {
		return leasetable.NotHeld(g)
	}
	_, refused, err := d.updateGrant(ctx, "renew", g.Key, g, "SET #v = #v + :one, #t = :ttl",
		map[string]types.AttributeValue{":ttl": num(millis(g.TTL))}, nil)
	if err != nil {
		return err
	}
	if refused {
		return leasetable.NotHeld(g)
	}
	return nil
}

// Release implements driver.Driver: one UpdateItem conditional on owner and
// fence that removes the owner and keeps the fence.
func (d *Driver) Release(ctx context.Context, g driver.Grant) error {
	if err := d.checkOpen(); err != nil {
		return err
	}
	if g.Owner == "" {
		return leasetable.NotHeld(g)
	}
	_, refused, err := d.updateGrant(ctx, "release", g.Key, g, "SET #v = #v + :one REMOVE #o, #t", nil, nil)
	if err != nil {
		return err
	}
	if refused {
		return leasetable.NotHeld(g)
	}
	d.obs.forget(g.Key)
	return nil
}

// updateGrant applies expr to key's item if it still carries g's owner
// and fence, and returns the new item; refused reports a failed
// condition. expr may use #o, #f, #v, #t, :one and the names and values it
// is given.
func (d *Driver) updateGrant(ctx context.Context, op, key string, g driver.Grant, expr string,
	vals map[string]types.AttributeValue, names map[string]string) (it leaseItem, refused bool, err error) {
	allVals := map[string]types.AttributeValue{":owner": str(g.Owner), ":fence": num(g.Fence), ":one": num(1)}
	for k, v := range vals {
		allVals[k] = v
	}
	allNames := grantNames()
	for k, v := range names {
		allNames[k] = v
	}
	var out *dynamodb.UpdateItemOutput
	sent, err := d.call(ctx, func(ctx context.Context) (err error) {
		out, err = d.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName:                 aws.String(d.table),
			Key:                       d.leaseKey(key),
			UpdateExpression:          aws.String(expr),
			ConditionExpression:       aws.String("#o = :owner AND #f = :fence"),
			ExpressionAttributeNames:  allNames,
			ExpressionAttributeValues: allVals,
			ReturnValues:              types.ReturnValueAllNew,
		}, noRetry)
		return err
	})
	at := d.clk.Now()
	var ccf *types.ConditionalCheckFailedException
	switch {
	case errors.As(err, &ccf):
		return it, true, nil
	case err != nil:
		return it, false, d.classify(op, key, true, sent, err)
	}
	if it, err = decodeLease(key, out.Attributes); err != nil {
		return it, false, err
	}
	d.obs.see(key, it, at)
	return it, false, nil
}

// read returns key's lease item by a strongly consistent read, whether it
// exists, and when the answer arrived.
func (d *Driver) read(ctx context.Context, op, key string) (it leaseItem, found bool, at time.Time, err error) {
	var out *dynamodb.GetItemOutput
	_, err = d.call(ctx, func(ctx context.Context) (err error) {
		out, err = d.client.GetItem(ctx, &dynamodb.GetItemInput{
			TableName:      aws.String(d.table),
			Key:            d.leaseKey(key),
			ConsistentRead: aws.Bool(true),
		}, noRetry)
		return err
	})
	at = d.clk.Now()
	if err != nil {
		return it, false, at, d.classify(op, key, false, false, err)
	}
	if len(out.Item) == 0 {
		return it, false, at, nil
	}
	it, err = decodeLease(key, out.Item)
	return it, err == nil, at, err
}

// decodeLease decodes a lease item. An attribute of the wrong type (an
// item written by another tool) is an error matching ErrSchema.
func decodeLease(key string, m map[string]types.AttributeValue) (leaseItem, error) {
	var it leaseItem
	var err error
	var hasOwner, hasTTL bool
	var ttl uint64
	if it.owner, hasOwner, err = getS(m, attrOwner); err != nil {
		return it, itemError(key, err)
	}
	if it.fence, _, err = getN(m, attrFence); err != nil {
		return it, itemError(key, err)
	}
	if it.version, _, err = getN(m, attrVersion); err != nil {
		return it, itemError(key, err)
	}
	if ttl, hasTTL, err = getN(m, attrTTL); err != nil {
		return it, itemError(key, err)
	}
	it.ttl = time.Duration(ttl) * time.Millisecond
	if hasOwner && (it.owner == "" || !hasTTL || ttl == 0 || it.fence == 0) {
		return it, itemError(key, fmt.Errorf("an owner without a fence and a positive %s", attrTTL))
	}
	if av, ok := m[attrBreak]; ok {
		bm, ok := av.(*types.AttributeValueMemberM)
		if !ok {
			return it, itemError(key, fmt.Errorf("attribute %s is %s, want a map", attrBreak, avType(av)))
		}
		rec, err := decodeBreak(key, bm.Value)
		if err != nil {
			return it, err
		}
		it.lastBreak = &rec
	}
	return it, nil
}

func itemError(key string, err error) error {
	return fmt.Errorf("dynamodb: item of %q: %w: %v", key, ErrSchema, err)
}

func getS(m map[string]types.AttributeValue, name string) (string, bool, error) {
	av, ok := m[name]
	if !ok {
		return "", false, nil
	}
	s, ok := av.(*types.AttributeValueMemberS)
	if !ok {
		return "", true, fmt.Errorf("attribute %s is %s, want a string", name, avType(av))
	}
	return s.Value, true, nil
}

func getN(m map[string]types.AttributeValue, name string) (uint64, bool, error) {
	av, ok := m[name]
	if !ok {
		return 0, false, nil
	}
	n, ok := av.(*types.AttributeValueMemberN)
	if !ok {
		return 0, true, fmt.Errorf("attribute %s is %s, want a number", name, avType(av))
	}
	v, err := strconv.ParseUint(n.Value, 10, 64)
	if err != nil {
		return 0, true, fmt.Errorf("attribute %s is %q, want a whole number", name, n.Value)
	}
	return v, true, nil
}

// avType names an attribute value's DynamoDB type for error messages.
func avType(av types.AttributeValue) string {
	switch av.(type) {
	case *types.AttributeValueMemberS:
		return "a string"
	case *types.AttributeValueMemberN:
		return "a number"
	case *types.AttributeValueMemberB:
		return "binary"
	case *types.AttributeValueMemberBOOL:
		return "a boolean"
	case *types.AttributeValueMemberM:
		return "a map"
	case *types.AttributeValueMemberL:
		return "a list"
	case *types.AttributeValueMemberNULL:
		return "null"
	}
	return fmt.Sprintf("%T", av)
}
