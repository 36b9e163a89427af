// Package fencedetcd is the fenced backend for etcd (v3 API), compatible with
// etcd's own lock recipe (the concurrency package and `etcdctl lock`).
//
// Import it for its side effect to open stores by URL:
//
//	import _ "github.com/fenced-dev/fenced/fencedetcd"
//
//	client, err := fenced.Open(ctx, "etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379", nil)
//
// or wrap a client you already have with New.
//
// # URL
//
// etcd://[user:password@]host:port[,host:port...][/][?prefix=P&dial_timeout=D]
//
// prefix (default "fenced/") is prepended to every key to form the etcd lock
// name; dial_timeout (default 5s) bounds the first contact.
//
// The client fenced builds from a URL pings each connection with gRPC
// keepalive after KeepAliveTime (10s) without a word from the server. It
// drops the connection when a ping is not answered within KeepAliveTimeout
// (5s). So a connection whose peer stopped answering without closing it (a
// partition, a frozen server) is given up within 15s. Its blocked requests
// and streams fail, and the client moves to another endpoint. A lost
// connection is tried again at most ReconnectMaxDelay (1s) apart, so the
// client is back within about a second of etcd. etcd refuses
// pings more frequent than its --grpc-keepalive-min-time (default 5s). A
// lease's local validity does not wait for any of this: its context is
// cancelled when its validity runs out, whatever its requests are doing. A
// client passed to New is the caller's, keepalive included.
//
// # Recipe
//
// A lease on key K is etcd's mutex on the lock name prefix+K. The holder
// puts the key prefix+K+"/"+hex(etcd lease ID), attached to an etcd lease.
// The key with the lowest create revision holds the lock. A waiter watches
// only the key created just before its own (no thundering herd), and is
// served in arrival order. A '/' or '%' in a key is escaped (%2F, %25), so
// a key maps to exactly one lock name.
//
// The fence is the holder key's create revision. etcd's revision is a
// cluster-wide counter agreed by Raft. So the fence strictly increases
// across releases, expiries, breaks, restarts and leader failovers.
//
// fenced and `etcdctl lock prefix+K` exclude each other. When etcdctl gets
// the lock without waiting, the ETCD_LOCK_REV it exports to its child equals
// the fence fenced reports for that hold (its key's create revision). After
// waiting, etcdctl exports the later revision at which it got the lock. That
// is still above every earlier holder's fence.
//
// The transaction that puts a waiter key also writes the key prefix+K
// itself. That key sits beside the lock's waiter keys prefix+K+"/...",
// outside the range etcd's recipes scan. Its mod revision is then the new
// key's fence. So Inspect reports the newest fence of a free key, however
// its last grant ended (released, broken or expired). A release is one
// plain delete of the holder's key, as etcd's Mutex unlocks (a transaction
// costs etcd 3.4 far more, see docs/design-notes.md). It can never remove a
// later grant's key of the same name: the key's name carries the session's
// etcd lease ID, which only this driver uses, and the driver puts no other
// key of that name on the session until the delete is answered. A release
// of a grant the driver no longer tracks compares the key's create
// revision and owner in a transaction. Break records the fence of the
// holder it deletes (etcdctl's holders write no record of their own).
//
// # Sessions
//
// The driver keeps one etcd lease (a session) per TTL (whole seconds,
// rounded up). It shares the session between all the keys it holds with
// that TTL. So renewing a thousand fenced leases costs one keep-alive plus
// one read, not a thousand writes. (The driver implements
// driver.BatchRenewer. The keys of a session carrying many grants are
// checked with one listing of the session's keys, LeaseTimeToLive, whatever
// their number.)
//
// Keep-alives go out on one long-lived stream, on demand. Every acquisition
// and renewal makes sure one was sent no earlier than the request began, so
// the session outlives the lease's local validity. If the process stalls,
// the session expires on the server's clock, and etcd deletes every key on
// it. The driver's loss watch (driver.LossWatcher) cancels the lease of a
// key deleted behind its back: session expired, or broken by an admin. All
// loss watches share one long-lived Watch stream, with no goroutine per
// watched lease. So a client can hold a hundred thousand leases with a
// handful of goroutines. A grant that its holder stops renewing, while
// other grants keep the session alive, is deleted by the driver when its
// TTL has passed. So leases with ManualRenew end on time.
//
// An observer (Client.Watch, an election's Observe, a partitions member's
// doorbell) watches the deletes of the key's waiter keys, one Watch each:
// a release, a break or an expiry wakes it at once.
//
// etcd counts lease TTLs in whole seconds and raises short ones to its own
// minimum (one and a half election timeouts), so the driver accepts TTLs of
// one second or more. A session's TTL is the grants' TTL rounded up to
// whole seconds plus one second of headroom, which lets a busy client skip
// keep-alives sent less than a second ago; a holder that crashes blocks
// others for that long.
package fencedetcd

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/backend/keyname"
	"github.com/fenced-dev/fenced/internal/backend/sessionlock"
	"github.com/fenced-dev/fenced/internal/backend/urlquery"
	"github.com/fenced-dev/fenced/internal/core/ttlrule"
)

// DefaultPrefix is prepended to keys when Options.Prefix is empty.
const DefaultPrefix = "fenced/"

// The gRPC keepalive of the client fenced builds from a URL (see the
// package comment).
const (
	KeepAliveTime    = 10 * time.Second
	KeepAliveTimeout = 5 * time.Second
)

// ReconnectMaxDelay caps the pause between the reconnection attempts of the
// client fenced builds from a URL. gRPC's default backs off up to two
// minutes. After an outage of etcd of a dozen seconds the client tried
// again only about 5 s after etcd was back. Meanwhile the others went on (and
// a waiter whose turn came meanwhile kept the key from all of them).
const ReconnectMaxDelay = time.Second

// Options configure a Driver. The zero value gives the defaults.
type Options struct {
	// Prefix is prepended to every key to form its etcd lock name, as used
	// by `etcdctl lock NAME`. Default DefaultPrefix. Use "/" (or any
	// non-empty string) deliberately: a key K then maps to lock name
	// Prefix+K.
	Prefix string
}

func init() {
	fenced.Register("etcd", openURL, Expiry)
}

// checkPrefix applies the backend's rule for key prefixes: etcd keys are
// any bytes, but a NUL would end the name in tools that print keys as C
// strings (and etcdctl cannot type it). Errors match fenced.ErrInvalidURL.
func checkPrefix(prefix string) error {
	if i := strings.IndexByte(prefix, 0); i >= 0 {
		return fmt.Errorf("%w: etcd key prefix %q has a NUL byte at byte %d (any other bytes are allowed)", fenced.ErrInvalidURL, prefix, i)
	}
	return nil
}

// openURL opens etcd://host:port[,host:port...][/][?prefix=...&dial_timeout=...].
func openURL(ctx context.Context, u *url.URL) (driver.Driver, error) {
	if u.Opaque != "" {
		return nil, fmt.Errorf("%w: etcd URL must look like etcd://host:port[,host:port...]", fenced.ErrInvalidURL)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("%w: etcd URL names no endpoint (want etcd://host:port[,host:port...])", fenced.ErrInvalidURL)
	}
	if u.Path != "" && u.Path != "/" {
		return nil, fmt.Errorf("%w: etcd URL has path %q; give the key prefix as ?prefix=", fenced.ErrInvalidURL, u.Path)
	}
	eps, err := sessionlock.Endpoints(u.Host, "etcd endpoint")
	if err != nil {
		return nil, err
	}
	q, err := urlquery.Parse(u.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("etcd URL: %w", err)
	}
	var opts Options
	prefix, ok, err := q.Take("prefix")
	if err == nil && ok && prefix == "" {
		err = fmt.Errorf("%w: etcd URL option prefix is empty", fenced.ErrInvalidURL)
	}
	if err == nil {
		err = checkPrefix(prefix)
	}
	if err != nil {
		return nil, err
	}
	opts.Prefix = prefix
	dialTimeout, ok, err := q.TakeDuration("dial_timeout")
	if err != nil {
		return nil, fmt.Errorf("etcd URL: %w", err)
	}
	if !ok {
		dialTimeout = 5 * time.Second
	}
	if err := q.NoRest("prefix", "dial_timeout"); err != nil {
		return nil, fmt.Errorf("etcd URL: %w", err)
	}
	cfg := clientv3.Config{Endpoints: eps, DialTimeout: dialTimeout, Logger: zap.NewNop(),
		DialKeepAliveTime: KeepAliveTime, DialKeepAliveTimeout: KeepAliveTimeout,
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: ReconnectMaxDelay},
			MinConnectTimeout: dialTimeout,
		})}}
	if u.User != nil {
		cfg.Username = u.User.Username()
		cfg.Password, _ = u.User.Password()
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: etcd client for %s: %v", fenced.ErrUnavailable, strings.Join(eps, ","), err)
	}
	// clientv3.New does not wait for a connection: ask once, so an
	// unreachable cluster is reported here rather than on first use.
	pctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	if _, err := cli.Get(pctx, "fenced-probe", clientv3.WithCountOnly()); err != nil {
		cli.Close()
		return nil, fmt.Errorf("%w: cannot reach etcd at %s within %v: %v", fenced.ErrUnavailable, strings.Join(eps, ","), dialTimeout, err)
	}
	d, err := New(cli, &opts)
	if err != nil {
		cli.Close()
		return nil, err
	}
	d.ownsClient = true
	return d, nil
}

// Driver is the etcd driver. Wrap it with fenced.NewClient. It is safe for
// concurrent use.
type Driver struct {
	cli        *clientv3.Client
	prefix     string
	ownsClient bool

	mu       sync.Mutex
	closed   bool
	sessions map[int64][]*session // by TTL in seconds
	ka       *keepAliver
	losses   *lossWatches
	grants   *sessionlock.Grants[*entry]
	ctx      context.Context // cancelled by Close
	cancel   context.CancelFunc

	// renewHook, set by tests only, runs in RenewBatch after the reads,
	// before their outcome is applied.
	renewHook func()
	// releaseHook, set by tests only, runs in a tracked grant's release
	// once its name is pinned, before its delete is sent.
	releaseHook func(e *entry)
}

// New returns a driver over cli, which stays the caller's to close (after
// the driver). opts may be nil.
func New(cli *clientv3.Client, opts *Options) (*Driver, error) {
	if cli == nil {
		return nil, fmt.Errorf("etcd: New: nil client")
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if err := checkPrefix(o.Prefix); err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	d := &Driver{
		cli: cli, prefix: o.Prefix,
		sessions: map[int64][]*session{},
		ctx:      ctx, cancel: cancel,
		ka: &keepAliver{conn: cli.ActiveConnection(), ctx: ctx},
	}
	d.losses = &lossWatches{conn: cli.ActiveConnection(), ctx: ctx, get: d.getKey}
	d.grants = sessionlock.NewGrantsBatched(d.endEntries, reapBatch, d.freeName)
	return d, nil
}

// Client returns the etcd client under d.
func (d *Driver) Client() *clientv3.Client { return d.cli }

// LockName returns the etcd lock name (as given to `etcdctl lock`) of key.
func (d *Driver) LockName(key string) string { return d.prefix + keyname.Escape(key) }

// guarantees is what the backend promises, the part of Capabilities
// that says how far a lease can be trusted.
func (d *Driver) guarantees() driver.Capabilities {
	return sessionlock.Capabilities("fence = create revision of the holder's key (Raft-agreed, never reissued); " +
		"TTLs are whole seconds at the server; " +
		// The lessor counts TTLs on the leader's monotonic clock.
		"safe from clock steps: lease TTLs count down on the leader's monotonic clock, and a new leader extends them, never shortens them")
}

// Expiry is how etcd keeps a grant: the session carrying it is the TTL
// rounded up to whole seconds plus one (sessionSeconds), and the lessor
// revokes expired leases every 500ms. TTLs are a second or more.
var Expiry = driver.Expiry{
	Name: "etcd", Pad: time.Second, Granularity: time.Second, Sweep: 500 * time.Millisecond,
	MinTTL: time.Second, MaxTTL: ttlrule.Max,
	Note: "etcd counts lease TTLs in whole seconds: the session is ceil(TTL)+1s, and the lessor revokes expired leases every 500ms",
}

// Capabilities implements driver.Driver: the election recipe's FIFO queue
// of keys (a watch on the predecessor), observers woken by deletes, batch
// renewal, loss watches and proclaimed values. TTLs are of a second or
// more (etcd leases have a one-second granularity).
func (d *Driver) Capabilities() driver.Capabilities {
	c := d.guarantees()
	c.Queue, c.FIFO, c.BatchRenew, c.WatchLoss, c.Value, c.Keeps = true, true, true, true, true, Expiry
	c.Checkpoint, c.Observe = true, true
	return c
}

// Close stops the driver's background work and, when the driver was opened
// by URL, closes its etcd client. Grants are left to expire with their
// sessions.
func (d *Driver) Close() error {
	d.mu.Lock()
	already := d.closed
	d.closed = true
	d.mu.Unlock()
	if already {
		return nil
	}
	d.grants.Close()
	d.losses.close()
	d.cancel()
	if d.ownsClient {
		return d.cli.Close()
	}
	return nil
}
