// Package fencedpostgres is the PostgreSQL backend of fenced: a lease table
// whose rows carry the fencing counter, with waiters woken by
// LISTEN/NOTIFY. WithAdvisoryLock covers the simpler case where the
// database itself is the lock.
//
//	import _ "github.com/fenced-dev/fenced/fencedpostgres"
//
//	client, err := fenced.Open(ctx, "postgres://app:secret@db.internal:5432/app?table=leases", nil)
//
// Or pass New a *pgxpool.Pool you already have.
//
// # URL
//
// postgres://user:password@host:port/database?param=value (postgresql://
// too). Every parameter pgx understands (sslmode, connect_timeout,
// pool_max_conns, default_query_exec_mode, ...) goes to pgx. So do these
// server settings: application_name, client_encoding, options,
// search_path, timezone, datestyle, intervalstyle, statement_timeout,
// lock_timeout, idle_in_transaction_session_timeout and
// idle_session_timeout. Put any other setting in options=-c NAME=VALUE.
// Any other parameter, or a setting the server refuses, is an
// ErrInvalidURL. fenced's own parameters:
//
//   - table=NAME: the lease table (default fenced_leases). Lower-case
//     letters, digits and underscores, at most 48 bytes. The audit table is
//     NAME_breaks, the floor table NAME_floor. Use search_path to choose a
//     schema.
//   - notify=off: do not LISTEN; waiters poll with backoff and jitter.
//
// # Guarantees
//
// The fence is strict and as durable as a committed row. Across a failover
// it holds only with synchronous replication (docs/failover.md). Expiry follows the database's
// wall clock: a forward step ends grants early. A release wakes one waiter.
//
// # Caveats
//
//   - Open your own pool on the database with DatabaseURL(storeURL).
//     PoolOf(client) is fenced's pool: saturating it delays renewals.
//   - Behind PgBouncer in transaction mode, add
//     default_query_exec_mode=exec. LISTEN cannot pass it, so the driver
//     polls unless Options.ListenConfig is a direct connection.
//   - New refuses an existing table of the wrong shape with ErrSchema.
//
// How the driver keeps a lease, and why: docs/backends.md.
package fencedpostgres

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/backend/leasetable"
	"github.com/fenced-dev/fenced/internal/backend/sqllease"
	"github.com/fenced-dev/fenced/internal/backend/urlquery"
	"github.com/fenced-dev/fenced/internal/core/storeurl"
)

func init() {
	expiry := driver.Expiry{Name: "PostgreSQL", Note: "expiry by now() inside the statement, to the microsecond"}
	fenced.Register("postgres", openURL, expiry)
	fenced.Register("postgresql", openURL, expiry)
}

// Options configure New. The zero value (or nil) gives the defaults.
type Options struct {
	// Table is the lease table (default "fenced_leases"); see the package
	// documentation for the naming rule.
	Table string
	// DisableNotify turns LISTEN off: waiters poll with backoff.
	DisableNotify bool
	// ListenConfig is the connection used for LISTEN. Default: the pool's
	// connection config. Set it to a direct connection when the pool goes
	// through a transaction-mode pooler.
	ListenConfig *pgx.ConnConfig
	// ProbeTimeout bounds the startup check that notifications arrive.
	// Default 5s.
	ProbeTimeout time.Duration
	// ListenThroughProxy LISTENs on the pool's connection config even when
	// the server sees another client address than the pool's connection
	// has (a TCP proxy or a pooler in between). By default such a driver
	// does not LISTEN: behind a transaction-mode pooler the LISTEN would
	// stay on a shared server connection (PgBouncer 1.18 then dies when a
	// notification meets a cancelled query). The URL says notify=on.
	ListenThroughProxy bool
}

// Driver is the PostgreSQL lease-table driver. It implements driver.Driver,
// driver.Notifier, driver.BatchRenewer, driver.BreakLogger,
// and driver.FenceFloorer. Its methods are safe for concurrent use.
type Driver struct {
	pool     *pgxpool.Pool
	db       *pgxDB
	table    string // unquoted, validated
	channel  string
	listener *listener // nil when notifications are off
	note     string
	*sqllease.Engine
}

// Besides what the engine implements for every SQL backend
// (sqllease.Engine), the driver is a driver.Notifier and a
// driver.ObserveNotifier.
var _ interface {
	driver.Driver
	driver.Notifier
	driver.ObserveNotifier
} = (*Driver)(nil)

// ErrSchema means the lease, audit or floor table exists with a shape
// other than the one the driver needs (from an older fenced or another
// tool). Nothing is changed when it is returned.
var ErrSchema = leasetable.ErrSchema

// urlParams are fenced's own URL query parameters, removed before the URL
// reaches pgx.
const paramNotify = "notify"

func openURL(ctx context.Context, u *url.URL) (driver.Driver, error) { return open(ctx, u) }

// Open connects to the store named by a postgres:// or postgresql:// URL
// (see the package documentation) and returns a driver that owns its pool.
// Use fenced.Open for a *fenced.Client. Errors match fenced.ErrInvalidURL
// (malformed URL or parameter), fenced.ErrUnavailable (server unreachable,
// authentication refused) or ErrSchema; none contains the
// password.
func Open(ctx context.Context, rawURL string) (*Driver, error) {
	u, err := storeurl.Parse(rawURL)
	if err != nil {
		return nil, err
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return nil, fmt.Errorf("%w: scheme %q, want postgres or postgresql", fenced.ErrInvalidURL, u.Scheme)
	}
	d, err := open(ctx, u)
	if err != nil {
		return nil, fmt.Errorf("postgres: open %s: %w", storeurl.Redact(rawURL), err)
	}
	return d, nil
}

func open(ctx context.Context, u *url.URL) (*Driver, error) {
	if u.Opaque != "" {
		return nil, fmt.Errorf("%w: want postgres://user:password@host:port/database", fenced.ErrInvalidURL)
	}
	p, err := urlquery.Parse(u.RawQuery)
	if err != nil {
		return nil, err
	}
	table, err := leasetable.TakeTable(p)
	if err != nil {
		return nil, err
	}
	opts := &Options{Table: table}
	v, ok, err := p.Take(paramNotify)
	if err != nil {
		return nil, err
	}
	q := p.Rest()
	if ok {
		switch strings.ToLower(v) {
		case "on", "true", "1":
			opts.ListenThroughProxy = true
		case "off", "false", "0":
			opts.DisableNotify = true
		default:
			return nil, fmt.Errorf("%w: notify=%q, want on or off", fenced.ErrInvalidURL, v)
		}
	}
	password, _ := u.User.Password()
	if password == "" {
		password = q.Get("password")
	}
	pu := *u
	pu.Scheme = "postgres"
	pu.RawQuery = urlquery.Encode(q)
	cfg, err := pgxpool.ParseConfig(pu.String())
	if err != nil {
		return nil, fmt.Errorf("%w: %s", fenced.ErrInvalidURL, leasetable.Scrub(err.Error(), password))
	}
	if err := checkParams(q, cfg); err != nil {
		return nil, err
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: %s", fenced.ErrInvalidURL, leasetable.Scrub(err.Error(), password))
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, connectError(cfg.ConnConfig, err, password)
	}
	d, err := New(ctx, pool, opts)
	if err != nil {
		pool.Close()
		return nil, err
	}
	d.db.owns = true
	return d, nil
}

// connectError describes a failure to reach the server, without the
// password, matching fenced.ErrUnavailable.
func connectError(cfg *pgx.ConnConfig, err error, password string) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42704" || pgErr.Code == "22023") {
		// A setting of the URL (options=-c NAME=VALUE) the server does
		// not know, or a value it refuses: a usage error, not an outage.
		return fmt.Errorf("%w: the server refused a setting of the URL: %s (SQLSTATE %s)",
			fenced.ErrInvalidURL, leasetable.Scrub(pgErr.Message, password), pgErr.Code)
	}
	if errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "28") {
		return fmt.Errorf("%w: authentication failed for user %q at %s:%d: %s (SQLSTATE %s)",
			fenced.ErrUnavailable, cfg.User, cfg.Host, cfg.Port, leasetable.Scrub(pgErr.Message, password), pgErr.Code)
	}
	return fmt.Errorf("%w: cannot connect to PostgreSQL at %s:%d: %s",
		fenced.ErrUnavailable, cfg.Host, cfg.Port, leasetable.Scrub(err.Error(), password))
}

// New returns a driver over pool, creating the lease and audit tables if
// they are missing. An existing table of another shape (an older fenced, or
// another tool's table of the same name) gives an error matching
// ErrSchema and changes nothing. Close does not close pool.
// opts may be nil.
func New(ctx context.Context, pool *pgxpool.Pool, opts *Options) (*Driver, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	table, err := leasetable.TableOrDefault(o.Table)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	o.Table = table
	if o.ProbeTimeout <= 0 {
		o.ProbeTimeout = 5 * time.Second
	}
	d := &Driver{pool: pool, db: &pgxDB{pgxConn: pgxConn{pool}, pool: pool}, table: o.Table, channel: o.Table + "_free"}
	d.Engine = sqllease.New(d.dialect(), d.db)
	if err := d.ensureSchema(ctx); err != nil {
		return nil, err
	}
	if o.DisableNotify {
		d.note = "notifications disabled (notify=off): waiters poll with backoff and jitter"
		return d, nil
	}
	lcfg := o.ListenConfig
	if lcfg == nil {
		if !o.ListenThroughProxy {
			if err := checkDirect(ctx, pool); err != nil {
				d.note = fmt.Sprintf("LISTEN unavailable (%v): waiters poll with backoff and jitter; "+
					"behind a transaction-mode pooler set Options.ListenConfig to a direct connection, "+
					"behind a plain TCP proxy say notify=on", err)
				return d, nil
			}
		}
		lcfg = pool.Config().ConnConfig.Copy()
	}
	l, err := startListener(ctx, d, lcfg, o.ProbeTimeout)
	if err != nil {
		d.note = fmt.Sprintf("LISTEN unavailable (%v): waiters poll with backoff and jitter; "+
			"behind a transaction-mode pooler set Options.ListenConfig to a direct connection", err)
		return d, nil
	}
	d.listener = l
	d.db.listener = l
	return d, nil
}

// Pool returns the driver's connection pool, for an application that wants
// to share it (for example to guard writes with the lease's fence in the
// same database). Renewals use it too: see PoolOf.
func (d *Driver) Pool() *pgxpool.Pool { return d.pool }

// Table returns the lease table's name.
func (d *Driver) Table() string { return d.table }

// guarantees is what the backend promises, the part of Capabilities
// that says how far a lease can be trusted. The fence is strict: it lives in a
// committed row, so it survives restarts and crash recovery. A failover
// keeps it when the standby replicates synchronously.
func (d *Driver) guarantees() driver.Capabilities {
	g := driver.Capabilities{
		Fence:       fenced.FenceStrict,
		ServerClock: true,
		// now() is the database's wall clock.
		ClockStepSafe: false,
		Note: "fence is a counter on the lease row (durable with the row; after a failover only if replication was synchronous); " +
			"expiry by the database's now(), its wall clock (not safe from clock steps)",
	}
	if d.note != "" {
		g.Note += "; " + d.note
	} else {
		g.Note += "; waiters woken by LISTEN/NOTIFY, one per release across processes (a per-key line on a session advisory lock), " +
			"expiry without release caught by the client's fallback timer"
	}
	return g
}

// Capabilities implements driver.Driver: waiters and observers woken by
// LISTEN/NOTIFY while the driver has its LISTEN connection, and the lease
// table's batch renewal, break log, fence floor and prune.
func (d *Driver) Capabilities() driver.Capabilities {
	notify := d.listener != nil
	c := d.guarantees()
	c.Subscribe, c.Observe, c.BatchRenew, c.BreakLog, c.FenceFloor = notify, notify, true, true, true
	c.Checkpoint = true
	return c
}

// Close implements driver.Driver. It stops the LISTEN connection and, for a
// driver opened by URL, closes its pool. Grants are left to expire.
func (d *Driver) Close() error {
	_, err := d.Engine.Close()
	return err
}

// Subscribe implements driver.Notifier. The subscription is woken when a
// release or break of key is notified, and also whenever the LISTEN
// connection had to be re-established (notifications may have been
// missed). It fails when notifications are off or unavailable, and the
// portable client then polls.
func (d *Driver) Subscribe(ctx context.Context, key string) (driver.Subscription, error) {
	if err := d.CheckOpen(); err != nil {
		return nil, err
	}
	if d.listener == nil {
		return nil, fmt.Errorf("postgres: %w: %s", fenced.ErrUnsupported, d.note)
	}
	return d.listener.subscribe(key), nil
}

// SubscribeObserver implements driver.ObserveNotifier: the subscription
// is woken by every notified release or break of key, and never takes
// the wake-up meant for a waiter (see listener).
func (d *Driver) SubscribeObserver(ctx context.Context, key string) (driver.Subscription, error) {
	if err := d.CheckOpen(); err != nil {
		return nil, err
	}
	if d.listener == nil {
		return nil, fmt.Errorf("postgres: %w: %s", fenced.ErrUnsupported, d.note)
	}
	return d.listener.observe(key), nil
}

// checkDirect returns an error when the pool's connections do not reach
// the server directly: the server sees another client port than the
// connection's own (a pooler or a TCP proxy is in between). A connection
// over a Unix socket, or a server that cannot say, counts as direct; the
// LISTEN probe still checks that notifications arrive.
func checkDirect(ctx context.Context, pool *pgxpool.Pool) error {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return nil // the probe will say what is wrong
	}
	defer c.Release()
	local, ok := c.Conn().PgConn().Conn().LocalAddr().(*net.TCPAddr)
	if !ok {
		return nil
	}
	var port *int32
	if err := c.QueryRow(ctx, "SELECT inet_client_port()").Scan(&port); err != nil {
		return nil
	}
	if port == nil || int(*port) != local.Port {
		seen := "no client port"
		if port != nil {
			seen = fmt.Sprintf("client port %d", *port)
		}
		return fmt.Errorf("the server sees %s, this connection's is %d: a pooler or proxy is in between", seen, local.Port)
	}
	return nil
}
