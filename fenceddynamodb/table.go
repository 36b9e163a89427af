package fenceddynamodb

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/fenced-dev/fenced"
)

// Attribute names of the lease table. The key is (attrKey, attrRecord):
// one lease item per key (record "lease") and one audit item per break
// (record "break/" and the broken fence, zero-padded so they sort).
const (
	attrKey     = "lease_key"
	attrRecord  = "record"
	attrOwner   = "owner"
	attrFence   = "fence"
	attrVersion = "version"
	attrTTL     = "ttl_ms"
	attrBreak   = "last_break"

	attrAt     = "at_us"
	attrReason = "reason"
	attrBy     = "broken_by"

	recordLease = "lease"
	breakPrefix = "break/"
)

// tableActiveTimeout bounds the wait for a table being created.
const tableActiveTimeout = 2 * time.Minute

// ensureTable checks the table's key schema, creating the table first
// when create is set and it does not exist, and waits while it is being
// created.
func (d *Driver) ensureTable(ctx context.Context, create bool) error {
	desc, err := d.describe(ctx)
	var nf *types.ResourceNotFoundException
	if errors.As(err, &nf) {
		if !create {
			return fmt.Errorf("dynamodb: table %q: %w; create it with ?create=1 in the URL (Options.Create), or by hand with key schema %s",
				d.table, ErrNoTable, keySchemaText)
		}
		if err := d.create(ctx); err != nil {
			return err
		}
		desc, err = d.describe(ctx)
	}
	if err != nil {
		return d.classify("describe table", d.table, false, false, err)
	}
	deadline := time.Now().Add(tableActiveTimeout)
	for desc.TableStatus == types.TableStatusCreating {
		if time.Now().After(deadline) {
			return fmt.Errorf("dynamodb: table %q still CREATING after %v: %w", d.table, tableActiveTimeout, fenced.ErrUnavailable)
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			return fmt.Errorf("dynamodb: waiting for table %q to become active: %w: %w", d.table, fenced.ErrUnavailable, context.Cause(ctx))
		}
		if desc, err = d.describe(ctx); err != nil {
			return d.classify("describe table", d.table, false, false, err)
		}
	}
	if err := checkShape(d.table, desc); err != nil {
		return err
	}
	d.fence, d.tableNote = replication(desc)
	return nil
}

func (d *Driver) describe(ctx context.Context) (*types.TableDescription, error) {
	var out *dynamodb.DescribeTableOutput
	_, err := d.call(ctx, func(ctx context.Context) (err error) {
		out, err = d.client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(d.table)}, noRetry)
		return err
	})
	if err != nil {
		return nil, err
	}
	if out.Table == nil {
		return nil, fmt.Errorf("dynamodb: DescribeTable %q returned no table", d.table)
	}
	return out.Table, nil
}

func (d *Driver) create(ctx context.Context) error {
	sent, err := d.call(ctx, func(ctx context.Context) error {
		_, err := d.client.CreateTable(ctx, &dynamodb.CreateTableInput{
			TableName:   aws.String(d.table),
			BillingMode: types.BillingModePayPerRequest,
			AttributeDefinitions: []types.AttributeDefinition{
				{AttributeName: aws.String(attrKey), AttributeType: types.ScalarAttributeTypeS},
				{AttributeName: aws.String(attrRecord), AttributeType: types.ScalarAttributeTypeS},
			},
			KeySchema: []types.KeySchemaElement{
				{AttributeName: aws.String(attrKey), KeyType: types.KeyTypeHash},
				{AttributeName: aws.String(attrRecord), KeyType: types.KeyTypeRange},
			},
		}, noRetry)
		return err
	})
	var inUse *types.ResourceInUseException
	if errors.As(err, &inUse) {
		return nil // created meanwhile by someone else; its shape is checked next
	}
	if err != nil {
		return d.classify("create table", d.table, true, sent, err)
	}
	return nil
}

const keySchemaText = attrKey + " (string, partition key), " + attrRecord + " (string, sort key)"

// checkShape reports, matching ErrSchema, every way desc's key schema
// differs from the lease table's.
func checkShape(table string, desc *types.TableDescription) error {
	attrTypes := map[string]types.ScalarAttributeType{}
	for _, a := range desc.AttributeDefinitions {
		attrTypes[aws.ToString(a.AttributeName)] = a.AttributeType
	}
	var got []string
	for _, k := range desc.KeySchema {
		name := aws.ToString(k.AttributeName)
		got = append(got, fmt.Sprintf("%s %s %s", name, attrTypes[name], k.KeyType))
	}
	want := []string{attrKey + " S HASH", attrRecord + " S RANGE"}
	if strings.Join(got, ", ") == strings.Join(want, ", ") {
		return nil
	}
	return fmt.Errorf("dynamodb: %w: table %q exists with key schema (%s); fenced needs %s (another tool's table? choose another name)",
		ErrSchema, table, strings.Join(got, ", "), keySchemaText)
}

// replication returns the fence strength a table's replication allows,
// with a note when it is weaker than strict.
func replication(desc *types.TableDescription) (fenced.FenceStrength, string) {
	if len(desc.Replicas) == 0 || desc.MultiRegionConsistency == types.MultiRegionConsistencyStrong {
		return fenced.FenceStrict, ""
	}
	return fenced.FenceRepeatable, fmt.Sprintf("the table is a global table with %d replicas and eventual consistency: "+
		"conditions hold per region, so two regions can grant one key at once with the same fence "+
		"(use one region, or multi-Region strong consistency)", len(desc.Replicas))
}
