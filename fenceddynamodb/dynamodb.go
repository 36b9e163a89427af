// Package fenceddynamodb is the Amazon DynamoDB backend of fenced: a lease
// table whose items carry the fencing counter, kept with conditional writes.
// DynamoDB has no server clock, so waiters judge expiry by their own
// monotonic clocks (observed expiry).
//
//	import _ "github.com/fenced-dev/fenced/fenceddynamodb"
//
//	client, err := fenced.Open(ctx, "dynamodb:///leases?region=eu-west-1", nil)
//
// Or pass New an aws-sdk-go-v2 *dynamodb.Client you already have.
//
// # URL
//
//   - dynamodb:///TABLE: DynamoDB, with the AWS default credential chain.
//   - dynamodb://HOST:PORT/TABLE: a compatible server over plain HTTP
//     (DynamoDB Local, dynalite, LocalStack), dummy credentials by default.
//
// ACCESS_KEY:SECRET@ before the host gives static credentials (the secret
// is redacted from errors). TABLE defaults to fenced_leases: 3 to 255
// letters, digits, '_', '-' and '.'. Parameters:
//
//   - region=R: the region (default: the AWS configuration's), or a local
//     endpoint's signing region (default us-east-1).
//   - create=1: create a missing table (on-demand billing). Without it, a
//     missing table is an ErrNoTable.
//
// Any other parameter is refused. A table with another key schema is an
// ErrSchema.
//
// # Caveats
//
//   - Clock steps change nothing. A waiter's clock running faster than the
//     holder's by over SafetyMargin/TTL (1% by default) can take over early.
//   - A waiter arriving after the holder died waits a whole TTL. A try
//     that does not wait never takes over a dead holder.
//   - Inspect and List show a key held until this driver has watched it
//     unchanged for a TTL.
//   - Waiters poll: DynamoDB cannot notify.
//   - Never delete an item by hand: that restarts its fence counter.
//   - On a global table with eventual consistency the fence is
//     FenceRepeatable.
//
// How the driver keeps a lease, and why: docs/no-server-clock.md.
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
	"github.com/fenced-dev/fenced/internal/backend/leasetable"
	"github.com/fenced-dev/fenced/internal/backend/urlquery"
)

func init() {
	fenced.Register("dynamodb", openURL, keeps)
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
	fence     fenced.FenceStrength
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
// *fenced.Client. Errors match fenced.ErrInvalidURL (malformed URL or
// parameter), fenced.ErrUnavailable (endpoint unreachable, credentials
// refused), ErrNoTable or ErrSchema. None contains the secret key.
func Open(ctx context.Context, rawURL string) (*Driver, error) {
	return OpenWith(ctx, rawURL, nil)
}

func open(ctx context.Context, u *url.URL) (*Driver, error) { return openOpts(ctx, u, nil) }

// openOpts opens the store u names; base, if not nil, gives the options
// the URL does not (Clock, MaxInFlight).
func openOpts(ctx context.Context, u *url.URL, base *Options) (*Driver, error) {
	if u.Opaque != "" {
		return nil, fmt.Errorf("%w: want dynamodb:///TABLE?region=R or dynamodb://HOST:PORT/TABLE", fenced.ErrInvalidURL)
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
		return nil, fmt.Errorf("%w: region= is empty", fenced.ErrInvalidURL)
	}
	var endpoint string
	if u.Host != "" {
		host, port, err := net.SplitHostPort(u.Host)
		if err != nil || host == "" {
			return nil, fmt.Errorf("%w: endpoint %q: want HOST:PORT", fenced.ErrInvalidURL, u.Host)
		}
		if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
			return nil, fmt.Errorf("%w: endpoint %q: port %q is not a number in 1-65535", fenced.ErrInvalidURL, u.Host, port)
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
			return nil, fmt.Errorf("%w: credentials in the URL need both ACCESS_KEY and SECRET (ACCESS_KEY:SECRET@host)",
				fenced.ErrInvalidURL)
		}
		loadOpts = append(loadOpts, config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider(u.User.Username(), secret, "")))
	case endpoint != "":
		// Local servers accept any credentials but the SDK must sign.
		loadOpts = append(loadOpts, config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("fenced", "fenced", "")))
	}
	cfg, err := config.LoadDefaultConfig(ctx, loadOpts...)
	if err != nil {
		return nil, fmt.Errorf("%w: loading the AWS configuration: %v", fenced.ErrInvalidURL, err)
	}
	if cfg.Region == "" {
		return nil, fmt.Errorf("%w: no region: add ?region=R to the URL or set AWS_REGION", fenced.ErrInvalidURL)
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
// Errors match fenced.ErrInvalidURL and name the bad value and the rule.
func checkTable(name string) error {
	if name == "" || tableRE.MatchString(name) {
		return nil
	}
	return fmt.Errorf("%w: table name %q is not a DynamoDB table name (3 to 255 characters, each a letter, digit, _, - or .)",
		fenced.ErrInvalidURL, name)
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
		fence:    fenced.FenceStrict,
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
		return fenced.ErrClosed
	}
	return nil
}

// guarantees is what the backend promises, the part of Capabilities
// that says how far a lease can be trusted. The fence is strict. It is a
// counter on the lease item, raised by conditional writes that DynamoDB
// applies durably and in order per item. A global table with eventual
// consistency is the exception (see the package documentation).
func (d *Driver) guarantees() driver.Capabilities {
	note := "fence is a counter on the lease item, raised by a conditional UpdateItem; " +
		"no server clock: a waiter takes a grant over only after seeing the same version unchanged for a whole TTL " +
		"on its own monotonic clock (observed expiry), " +
		"so wall-clock steps change nothing, a waiter that arrives after the holder died waits up to one TTL more " +
		"than with a server clock, " +
		"and a TryAcquire that does not wait never takes over a dead holder (wait at least a TTL, or break it); " +
		"drift: if the waiter's clock runs faster than the holder's by more than SafetyMargin/TTL (1% by default) " +
		"a waiter could take over while the holder still trusts its lease, and only the fence protects the resource; " +
		"waiters poll with backoff (no notification); renewal is one conditional request per lease per period (no conditional batch write)"
	if d.tableNote != "" {
		note += "; " + d.tableNote
	}
	return driver.Capabilities{
		Fence:         d.fence,
		ServerClock:   false,
		ClockStepSafe: true,
		Note:          note,
	}
}

// keeps is how long a grant that is no longer renewed stands: a waiter
// takes it over once it has seen it unchanged for a whole TTL, so from one
// TTL up to twice the TTL after the holder's last renewal.
var keeps = driver.Expiry{Name: "DynamoDB", Observed: true,
	Note: "observed expiry: a waiter takes a grant over after seeing it unchanged for a whole TTL, " +
		"so a crashed holder's grant stands up to twice the TTL"}

// Capabilities implements driver.Driver: the break log.
func (d *Driver) Capabilities() driver.Capabilities {
	c := d.guarantees()
	c.BreakLog, c.Keeps = true, keeps
	return c
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
