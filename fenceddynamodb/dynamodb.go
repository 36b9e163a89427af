// Package fenceddynamodb is the Amazon DynamoDB backend of fenced: a lease
// table whose items carry the fencing counter, kept with conditional writes.
// DynamoDB has no server clock that a condition can read. So expiry is
// decided by the waiters' own monotonic clocks.
//
// Import it for its side effect to open stores by URL:
//
//	import _ "github.com/fenced-dev/fenced/fenceddynamodb"
//
//	client, err := fenced.Open(ctx, "dynamodb:///leases?region=eu-west-1", nil)
//
// or build a driver over a *dynamodb.Client from aws-sdk-go-v2 you already
// have with New.
//
// # URL
//
//   - dynamodb:///TABLE?region=R: DynamoDB in region R (default: the
//     region of the AWS configuration, AWS_REGION), with credentials from
//     the AWS default chain (environment, shared files, SSO, web identity,
//     container and instance roles).
//   - dynamodb://HOST:PORT/TABLE: a DynamoDB-compatible server at a local
//     endpoint over plain HTTP (DynamoDB Local, dynalite, LocalStack). With
//     no credentials in the URL, dummy static ones are used.
//
// In both, ACCESS_KEY:SECRET@ before the host gives static credentials
// (the secret is redacted from errors), TABLE defaults to fenced_leases and
// follows DynamoDB's rule (3 to 255 letters, digits, underscores, hyphens
// and dots: fenced-leases and Prod.Leases are fine), and the parameters
// are:
//
//   - region=R: the region (signing region for a local endpoint, default
//     us-east-1 there).
//   - create=1: create the table (on-demand billing) if it does not exist.
//     Without it a missing table is an error matching ErrNoTable.
//
// Any other parameter is refused. A table that exists with another key
// schema (another tool's lock table) is an error matching ErrSchema.
//
// # How a lease is kept
//
// Each key is one item (lease_key=KEY, record="lease") holding owner, fence,
// version and ttl_ms. A grant is one conditional UpdateItem. It raises the
// fence (if_not_exists(fence, 0) + 1) and the version, sets the owner and
// the TTL, and returns the new item (ReturnValues ALL_NEW). Its condition is
// that the item has no owner, or that this driver may take the grant over
// (below). A refused grant asks DynamoDB for the item that refused it
// (ReturnValuesOnConditionCheckFailure ALL_OLD; servers that do not return
// it cost one consistent GetItem more). If the item already names the
// caller's owner token, the grant is re-confirmed with a second conditional
// update, so a grant retried after an unknown outcome returns the same
// fence. Renew and release are UpdateItems conditional on owner and fence;
// renew raises the version, release removes the owner and raises the
// version. Items are never deleted: the fence counter lives on them, so it
// survives release, expiry and break. Deleting an item by hand restarts its
// counter; do not.
//
// # Expiry without a server clock
//
// A condition expression cannot read the time, and fenced never decides
// expiry from a timestamp a client wrote. So the driver keeps, per key, the
// grant it last saw (fence and version) and since when by its own monotonic
// clock (the receipt of the response that first showed it). It may take a
// grant over only once it has seen the same version for the grant's whole
// TTL, and the takeover write names that version: a renewal that landed
// meanwhile raised the version and makes the takeover fail. This is observed
// expiry (docs/no-server-clock.md).
//
// Consequences, declared in Guarantees:
//
//   - A wall-clock step on any machine changes nothing (ClockStepSafe):
//     only monotonic clocks are read.
//   - Clock rate matters: the holder trusts its lease for TTL minus its
//     SafetyMargin from before its last renewal was sent, the waiter waits
//     TTL from after it saw that renewal. If the waiter's clock runs faster
//     than the holder's by more than SafetyMargin/TTL (1% with the default
//     margin; NTP keeps clocks within 0.05%), the waiter could take over
//     while the holder still trusts its lease; the fence then protects the
//     resource.
//   - A waiter that arrives after the holder died still waits a whole TTL
//     from its first look: up to one TTL more than on a store with a server
//     clock. A TryAcquire that does not wait (MaxWait 0, `fenced run`
//     without --wait) never takes over a dead holder: wait at least a TTL,
//     or break the lease.
//   - Inspect and List report a key as held until this driver has watched
//     it unchanged for its TTL, with the time left on that watch; a process
//     that looks once sees every recorded owner as held.
//
// # Waiting and renewal
//
// DynamoDB cannot notify: waiters poll with backoff and full jitter. The
// time left on the waiter's observation caps each sleep. So a waiter polls
// about once a second at most, and tries the takeover as soon as it is
// allowed. BatchWriteItem cannot carry conditions. TransactWriteItems fails
// as a whole when one condition fails, at twice the write cost. So renewal
// is one conditional UpdateItem per lease per renewal period. They are sent
// in parallel, at most Options.MaxInFlight requests at a time per driver.
//
// # Errors
//
// The SDK's own retries are off for every call the driver makes (a retried
// conditional write can report a refusal for a write that was applied).
// Throttling, credential and missing-table errors match ErrUnavailable
// (nothing was applied); a write that was sent and got no answer, or a
// server error (5xx), matches ErrUnknownOutcome; conditional-check failures
// are the refusals ErrHeld and ErrNotHeld.
//
// # Break
//
// Break reads the item and ends its grant with an UpdateItem conditional on
// that grant's owner and fence, which also records the break on the item
// (last_break), so the break and its record are one atomic write. An
// audit item (lease_key=KEY, record="break/FENCE") is then written for the
// history, and before the next break of the key the previous record is
// written again if it is missing, so no break is lost. Breaks reads both.
//
// # Global tables
//
// Conditions hold within one region. A global table replicated with
// eventual consistency can grant one key in two regions at once, with the
// same fence: the driver then declares FenceRepeatable (so a correctness
// lease must accept it explicitly). Global tables with multi-Region strong
// consistency keep the fence strict.
package fenceddynamodb

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/clock"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/leasetable"
	"github.com/fenced-dev/fenced/internal/urlquery"
)

func init() {
	fenced.Register("dynamodb", openURL)
}

// DefaultTable is the lease table's name when the URL or Options name none.
const DefaultTable = leasetable.DefaultTable

// DefaultMaxInFlight is the default limit on one driver's requests in
// flight.
const DefaultMaxInFlight = 64

// localRegion is the signing region for a local endpoint named without
// ?region=.
const localRegion = "us-east-1"

// URL query parameters.
const (
	paramRegion = "region"
	paramCreate = "create"
)

// ErrSchema means the table exists with a key schema other than the one
// the driver needs (another tool's lock table, for example). Nothing is
// changed when it is returned.
var ErrSchema = leasetable.ErrSchema

// ErrNoTable means the lease table does not exist and the driver was not
// asked to create it (create=1, Options.Create).
var ErrNoTable = errors.New("lease table does not exist")

// Options configure New. The zero value (or nil) gives the defaults.
type Options struct {
	// Table is the lease table (default DefaultTable); see the package
	// documentation for the naming rule.
	Table string
	// Create creates the table with on-demand billing when it does not
	// exist, and waits until it is active.
	Create bool
	// Clock is the monotonic clock observations of other owners' grants
	// are timed with (see the package documentation). Default
	// clock.Real(). Give the same clock as the fenced.Client's when that
	// one is fake.
	Clock clock.Clock
	// MaxInFlight bounds the requests one driver has in flight at once
	// (renewing thousands of leases in one period sends that many
	// requests). Default DefaultMaxInFlight.
	MaxInFlight int
}

// Driver is the DynamoDB driver. It implements driver.Driver and
// driver.BreakLogger. Its methods are safe for concurrent use.
type Driver struct {
	client    *dynamodb.Client
	table     string
	clk       clock.Clock
	obs       *observer
	inflight  chan struct{}
	fence     driver.FenceStrength
	tableNote string

	mu     sync.Mutex
	closed bool
}

var (
	_ driver.Driver      = (*Driver)(nil)
	_ driver.BreakLogger = (*Driver)(nil)
)

func openURL(ctx context.Context, u *url.URL) (driver.Driver, error) { return open(ctx, u) }

// Open connects to the store named by a dynamodb:// URL (see the package
// documentation) and returns a driver. Use fenced.Open for a
// *fenced.Client. Errors match driver.ErrInvalidURL (malformed URL or
// parameter), driver.ErrUnavailable (endpoint unreachable, credentials
// refused), ErrNoTable or ErrSchema; none contains the secret key.
func Open(ctx context.Context, rawURL string) (*Driver, error) {
	return OpenWith(ctx, rawURL, nil)
}

func open(ctx context.Context, u *url.URL) (*Driver, error) { return openOpts(ctx, u, nil) }

// openOpts opens the store u names; base, if not nil, gives the options
// the URL does not (Clock, MaxInFlight).
func openOpts(ctx context.Context, u *url.URL, base *Options) (*Driver, error) {
	if u.Opaque != "" {
		return nil, fmt.Errorf("%w: want dynamodb:///TABLE?region=R or dynamodb://HOST:PORT/TABLE", driver.ErrInvalidURL)
	}
	q, err := urlquery.Parse(u.RawQuery)
	if err != nil {
		return nil, err
	}
	opts := &Options{}
	if base != nil {
		opts.Clock, opts.MaxInFlight = base.Clock, base.MaxInFlight
	}
	opts.Table = strings.TrimPrefix(u.Path, "/")
	if opts.Create, _, err = q.TakeBool(paramCreate); err != nil {
		return nil, err
	}
	region, hasRegion, err := q.Take(paramRegion)
	if err != nil {
		return nil, err
	}
	if err := q.NoRest(paramRegion, paramCreate); err != nil {
		return nil, err
	}
	if hasRegion && region == "" {
		return nil, fmt.Errorf("%w: region= is empty", driver.ErrInvalidURL)
	}
	var endpoint string
	if u.Host != "" {
		host, port, err := net.SplitHostPort(u.Host)
		if err != nil || host == "" {
			return nil, fmt.Errorf("%w: endpoint %q: want HOST:PORT", driver.ErrInvalidURL, u.Host)
		}
		if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
			return nil, fmt.Errorf("%w: endpoint %q: port %q is not a number in 1-65535", driver.ErrInvalidURL, u.Host, port)
		}
		endpoint = "http://" + u.Host
		if region == "" {
			region = localRegion
		}
	}
	if err := checkTable(opts.Table); err != nil {
		return nil, err
	}

	// The driver's HTTP client keeps as many idle connections as it may
	// have requests in flight, so a burst of renewals reuses them. (A
	// BuildableClient, so that AWS_CA_BUNDLE and the SDK's defaults apply.)
	httpClient := awshttp.NewBuildableClient().WithTransportOptions(func(tr *http.Transport) {
		tr.MaxIdleConnsPerHost = DefaultMaxInFlight
	})
	loadOpts := []func(*config.LoadOptions) error{config.WithHTTPClient(httpClient)}
	if region != "" {
		loadOpts = append(loadOpts, config.WithRegion(region))
	}
	switch {
	case u.User != nil:
		secret, _ := u.User.Password()
		if u.User.Username() == "" || secret == "" {
			return nil, fmt.Errorf("%w: credentials in the URL need both ACCESS_KEY and SECRET (ACCESS_KEY:SECRET@host)", driver.ErrInvalidURL)
		}
		loadOpts = append(loadOpts, config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider(u.User.Username(), secret, "")))
	case endpoint != "":
		// Local servers accept any credentials but the SDK must sign.
		loadOpts = append(loadOpts, config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("fenced", "fenced", "")))
	}
	cfg, err := config.LoadDefaultConfig(ctx, loadOpts...)
	if err != nil {
		return nil, fmt.Errorf("%w: loading the AWS configuration: %v", driver.ErrInvalidURL, err)
	}
	if cfg.Region == "" {
		return nil, fmt.Errorf("%w: no region: add ?region=R to the URL or set AWS_REGION", driver.ErrInvalidURL)
	}
	client := dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) {
		if endpoint != "" {
			o.BaseEndpoint = aws.String(endpoint)
		}
		o.Retryer = aws.NopRetryer{}
	})
	return New(ctx, client, opts)
}

// tableRE is DynamoDB's rule for table names: 3 to 255 letters, digits,
// underscores, hyphens and dots.
var tableRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{3,255}$`)

// checkTable applies DynamoDB's own rule for table names (tableRE), the
// one place this backend checks them; "" stands for DefaultTable. Names
// are only ever sent as request fields, never spliced into an expression.
// Errors match driver.ErrInvalidURL and name the bad value and the rule.
func checkTable(name string) error {
	if name == "" || tableRE.MatchString(name) {
		return nil
	}
	return fmt.Errorf("%w: table name %q is not a DynamoDB table name (3 to 255 characters, each a letter, digit, _, - or .)", driver.ErrInvalidURL, name)
}

// New returns a driver over client, checking that the lease table exists
// with the key schema the driver needs (and creating it when opts.Create
// is set). A missing table gives an error matching ErrNoTable, a table of
// another shape one matching ErrSchema; neither changes anything. The
// driver turns the SDK's retries off for its own calls (see the package
// documentation) but otherwise uses client as configured. opts may be nil.
func New(ctx context.Context, client *dynamodb.Client, opts *Options) (*Driver, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if client == nil {
		return nil, errors.New("dynamodb: New: client is nil")
	}
	if o.Table == "" {
		o.Table = DefaultTable
	}
	if err := checkTable(o.Table); err != nil {
		return nil, fmt.Errorf("dynamodb: %w", err)
	}
	if o.Clock == nil {
		o.Clock = clock.Real()
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = DefaultMaxInFlight
	}
	d := &Driver{
		client:   client,
		table:    o.Table,
		clk:      o.Clock,
		obs:      newObserver(o.Clock),
		inflight: make(chan struct{}, o.MaxInFlight),
		fence:    driver.FenceStrict,
	}
	if err := d.ensureTable(ctx, o.Create); err != nil {
		return nil, err
	}
	return d, nil
}

// Client returns the driver's DynamoDB client, for an application that
// wants to share it.
func (d *Driver) Client() *dynamodb.Client { return d.client }

// Table returns the lease table's name.
func (d *Driver) Table() string { return d.table }

func (d *Driver) checkOpen() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return driver.ErrClosed
	}
	return nil
}

// Guarantees implements driver.Driver. The fence is strict: a counter on
// the lease item, raised by conditional writes that DynamoDB applies
// durably and in order per item (unless the table is a global table with
// eventual consistency; see the package documentation).
func (d *Driver) Guarantees() driver.Guarantees {
	note := "fence is a counter on the lease item, raised by a conditional UpdateItem; " +
		"no server clock: a waiter takes a grant over only after seeing the same version unchanged for a whole TTL on its own monotonic clock (observed expiry), " +
		"so wall-clock steps change nothing, a waiter that arrives after the holder died waits up to one TTL more than with a server clock, " +
		"and a TryAcquire that does not wait never takes over a dead holder (wait at least a TTL, or break it); " +
		"drift: if the waiter's clock runs faster than the holder's by more than SafetyMargin/TTL (1% by default) a waiter could take over while the holder still trusts its lease, and only the fence protects the resource; " +
		"waiters poll with backoff (no notification); renewal is one conditional request per lease per period (no conditional batch write)"
	if d.tableNote != "" {
		note += "; " + d.tableNote
	}
	return driver.Guarantees{
		Fence:         d.fence,
		ServerClock:   false,
		ClockStepSafe: true,
		Note:          note,
	}
}

// keeps is how long a grant that is no longer renewed stands: a waiter
// takes it over once it has seen it unchanged for a whole TTL, so up to
// twice the TTL after the holder's last renewal.
var keeps = driver.Expiry{Name: "DynamoDB", ScaleNum: 2, ScaleDen: 1,
	Note: "observed expiry: a waiter takes a grant over after seeing it unchanged for a whole TTL"}

// Capabilities implements driver.Driver: the break log.
func (d *Driver) Capabilities() driver.Capabilities {
	return driver.Capabilities{BreakLog: true, Keeps: keeps}
}

// Close implements driver.Driver: later calls return ErrClosed. The
// DynamoDB client holds no connection of its own to close (idle HTTP
// connections time out). Grants are left to expire.
func (d *Driver) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	return nil
}
