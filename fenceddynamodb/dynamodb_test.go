package fenceddynamodb_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsdynamodb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/drivertest"
	"github.com/fenced-dev/fenced/fenceddynamodb"
	"github.com/fenced-dev/fenced/internal/testkit/crashtest"
	"github.com/fenced-dev/fenced/internal/testkit/opentest"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
	"github.com/fenced-dev/fenced/recipe/recipetest"
)

// server is the dynalite every test of the package shares, started once.
var server *testenv.Dynalite

// table is the lease table the shared tests use, created by TestMain.
const table = "fenced_leases"

func TestMain(m *testing.M) {
	crashtest.MaybeRunHolder()
	tb := testenv.NewMainTB()
	server = testenv.StartDynalite(tb, testenv.DynaliteConfig{})
	d, err := fenceddynamodb.Open(context.Background(), server.URL(table, "create=1"))
	if err != nil {
		tb.Fatal(err)
	}
	d.Close()
	os.Setenv("FENCED_DYNAMODB_URL", server.URL(table, "")) // for the examples
	code := m.Run()
	select {
	case <-server.Exited():
		fmt.Fprintf(os.Stderr, "dynalite exited during the tests:\n%s\n", server.Log.String())
		code = 1
	default:
	}
	tb.Close()
	os.Exit(code)
}

// ctxT is the context of a test: it ends with the test, or after two
// minutes.
var ctxT = opentest.Context

// open opens a driver on the shared table, closed when the test ends.
func open(t testing.TB) *fenceddynamodb.Driver {
	t.Helper()
	return opentest.Closed(t, fenceddynamodb.Open, server.URL(table, ""))
}

func TestConformance(t *testing.T) {
	h := drivertest.Harness{
		// Expiry tests sleep about this long; a waiter must also watch a
		// grant for a whole TTL before taking it over.
		ShortTTL: time.Second,
		Open:     opentest.Opener(fenceddynamodb.Open, server.URL(table, "")),
		BadURLs: []string{
			"dynamodb://127.0.0.1:1/Bad%20Name",
			"dynamodb://127.0.0.1:1/ab",
			"dynamodb://127.0.0.1:1/a/b",
			"dynamodb://127.0.0.1:1/leases?create=maybe",
			"dynamodb://127.0.0.1:1/leases?create=1&create=0",
			"dynamodb://127.0.0.1:1/leases?table=other",
			"dynamodb://127.0.0.1:1/leases?region=",
			"dynamodb://127.0.0.1:1/leases?a;b",
			"dynamodb://127.0.0.1:notaport/leases",
			"dynamodb://127.0.0.1/leases",
			"dynamodb://onlykey@127.0.0.1:1/leases",
			"dynamodb:leases",
		},
	}
	drivertest.RunConformanceTests(t, h)
	recipetest.RunConformanceTests(t, h)
}

// The table must exist with the lease table's key schema: a missing table
// is ErrNoTable unless create=1, another tool's table (Terraform's lock
// table has only a LockID partition key) is ErrSchema, and neither is
// changed.
func TestTableChecks(t *testing.T) {
	ctx := ctxT(t)
	if _, err := fenceddynamodb.Open(ctx, server.URL("never_created", "")); !errors.Is(err, fenceddynamodb.ErrNoTable) || !strings.Contains(err.Error(), "create=1") {
		t.Fatalf("open of a missing table: %v; want ErrNoTable saying how to create it", err)
	}
	d := open(t)
	raw := d.Client()
	_, err := raw.CreateTable(ctx, &awsdynamodb.CreateTableInput{
		TableName:            aws.String("terraform_locks"),
		BillingMode:          types.BillingModePayPerRequest,
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String("LockID"), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String("LockID"), KeyType: types.KeyTypeHash}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"", "create=1"} {
		_, err := fenceddynamodb.Open(ctx, server.URL("terraform_locks", q))
		if !errors.Is(err, fenceddynamodb.ErrSchema) || !strings.Contains(err.Error(), "LockID") {
			t.Fatalf("open of a foreign table (%q): %v; want ErrSchema naming its key", q, err)
		}
	}
	desc, err := raw.DescribeTable(ctx, &awsdynamodb.DescribeTableInput{TableName: aws.String("terraform_locks")})
	if err != nil || len(desc.Table.KeySchema) != 1 {
		t.Fatalf("the foreign table was changed: %+v, %v", desc, err)
	}
	// A table created by the driver is on-demand and has the lease key
	// schema; opening it again (with or without create) works.
	c, err := fenced.Open(ctx, server.URL("created_here", "create=1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	desc, err = raw.DescribeTable(ctx, &awsdynamodb.DescribeTableInput{TableName: aws.String("created_here")})
	if err != nil {
		t.Fatal(err)
	}
	if desc.Table.BillingModeSummary == nil || desc.Table.BillingModeSummary.BillingMode != types.BillingModePayPerRequest {
		t.Errorf("created table's billing: %+v, want PAY_PER_REQUEST", desc.Table.BillingModeSummary)
	}
	for _, q := range []string{"", "create=1"} {
		d, err := fenceddynamodb.Open(ctx, server.URL("created_here", q))
		if err != nil {
			t.Fatalf("reopen (%q): %v", q, err)
		}
		d.Close()
	}
	if g, notified := c.Capabilities(), c.Capabilities().Subscribe || c.Capabilities().Queue; g.Fence != fenced.FenceStrict || g.ServerClock || !g.ClockStepSafe || notified {
		t.Errorf("guarantees %+v, notified waiters %v: want strict fence, no server clock, safe from clock steps, no notification", g, notified)
	}
}

// An item written by another tool (a fence that is not a number) is a clear
// error naming the attribute, not a grant.
func TestForeignItemIsRefused(t *testing.T) {
	ctx := ctxT(t)
	d := open(t)
	key := "foreign:" + time.Now().Format("150405.000000")
	_, err := d.Client().PutItem(ctx, &awsdynamodb.PutItemInput{
		TableName: aws.String(table),
		Item: map[string]types.AttributeValue{
			"lease_key": &types.AttributeValueMemberS{Value: key},
			"record":    &types.AttributeValueMemberS{Value: "lease"},
			"owner":     &types.AttributeValueMemberS{Value: "someone"},
			"fence":     &types.AttributeValueMemberS{Value: "seven"},
			"version":   &types.AttributeValueMemberN{Value: "1"},
			"ttl_ms":    &types.AttributeValueMemberN{Value: "1000"},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.TryAcquire(ctx, key, "0123456789abcdef0123456789abcdef", time.Second); !errors.Is(err, fenceddynamodb.ErrSchema) || !strings.Contains(err.Error(), "fence") {
		t.Fatalf("acquire over a foreign item: %v; want ErrSchema naming the attribute", err)
	}
	if _, err := d.Inspect(ctx, key); !errors.Is(err, fenceddynamodb.ErrSchema) {
		t.Fatalf("inspect of a foreign item: %v; want ErrSchema", err)
	}
}

// A server that goes away and comes back: errors are actionable
// (ErrUnavailable or ErrUnknownOutcome, never a refusal), the same driver
// works again, and the fence counter carried on (dynalite keeps its data on
// disk here).
func TestServerDownThenBack(t *testing.T) {
	t.Parallel()
	srv := testenv.StartDynalite(t, testenv.DynaliteConfig{Persistent: true})
	d, err := fenceddynamodb.Open(ctxT(t), srv.URL(table, "create=1"))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	crashtest.ServerDownThenBack(t, srv, d)
}

// Breaks are recorded atomically with the break (on the lease item) and as
// audit items, oldest first, per key and for every key.
func TestBreakAudit(t *testing.T) {
	ctx := ctxT(t)
	d := open(t)
	key := "audit:" + time.Now().Format("150405.000000")
	var fences []uint64
	for i, reason := range []string{"first", "second", "third"} {
		owner := strings.Repeat(string(rune('a'+i)), 32)
		f, err := d.TryAcquire(ctx, key, owner, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		fences = append(fences, f)
		info, err := d.Break(ctx, key, reason, "test")
		if err != nil || info.Fence != f {
			t.Fatalf("break %d: %+v, %v", i, info, err)
		}
	}
	recs, err := d.Breaks(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 3 {
		t.Fatalf("breaks of %s: %+v, want 3", key, recs)
	}
	for i, r := range recs {
		if r.Fence != fences[i] || r.Reason != []string{"first", "second", "third"}[i] || r.By != "test" || r.Key != key || len(r.Owner) > 12 {
			t.Errorf("record %d: %+v", i, r)
		}
	}
	all, err := d.Breaks(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, r := range all {
		if r.Key == key {
			n++
		}
	}
	if n != 3 {
		t.Fatalf("Breaks(\"\") has %d records of %s, want 3", n, key)
	}
}

// A grant whose request reached the server but whose answer was lost is an
// unknown outcome (ErrUnknownOutcome, not a refusal and not "unavailable"),
// and asking again with the same owner returns the grant that was made,
// with the same fence, instead of a second grant.
func TestUnknownOutcomeThenIdempotentRetry(t *testing.T) {
	ctx := ctxT(t)
	proxy := testenv.StartProxy(t, testenv.Addr(server.Port))
	d, err := fenceddynamodb.Open(ctx, "dynamodb://"+proxy.Addr+"/"+table)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	key := uniqueKey("unknown")
	owner := "cafe0000000000000000000000000001"
	proxy.CutAfter(func(chunk []byte) bool { return bytes.Contains(chunk, []byte(owner)) })
	if _, err := d.TryAcquire(ctx, key, owner, time.Minute); !errors.Is(err, fenced.ErrUnknownOutcome) {
		t.Fatalf("grant whose answer was cut: %v; want ErrUnknownOutcome", err)
	}
	if proxy.Cuts() != 1 {
		t.Fatalf("the proxy cut %d connections, want 1", proxy.Cuts())
	}
	fence, err := d.TryAcquire(ctx, key, owner, time.Minute)
	if err != nil {
		t.Fatalf("retry by the same owner: %v", err)
	}
	out, err := d.Client().GetItem(ctx, &awsdynamodb.GetItemInput{
		TableName:      aws.String(table),
		Key:            map[string]types.AttributeValue{"lease_key": &types.AttributeValueMemberS{Value: key}, "record": &types.AttributeValueMemberS{Value: "lease"}},
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		t.Fatal(err)
	}
	f, _ := out.Item["fence"].(*types.AttributeValueMemberN)
	v, _ := out.Item["version"].(*types.AttributeValueMemberN)
	o, _ := out.Item["owner"].(*types.AttributeValueMemberS)
	if f == nil || v == nil || o == nil || f.Value != "1" || o.Value != owner {
		t.Fatalf("item after the retry: %v", out.Item)
	}
	if v.Value != "2" {
		t.Fatalf("version %s after the retry: the cut grant was not applied (version 2 = grant + re-confirmation), so the test did not exercise the retry of an applied grant", v.Value)
	}
	if fence != 1 {
		t.Fatalf("retry returned fence %d, want the cut grant's 1", fence)
	}
}
