// Package fencedzookeeper is the fenced backend for Apache ZooKeeper,
// compatible with Apache Curator's InterProcessMutex.
//
//	import _ "github.com/fenced-dev/fenced/fencedzookeeper"
//
//	client, err := fenced.Open(ctx, "zk://10.0.0.1:2181,10.0.0.2:2181/app/locks", nil)
//
// Or give New the same settings as Options.
//
// # URL
//
// zk://host:port[,host:port...][/chroot][?dial_timeout=D&tick_time=D]
//
// Key K locks the znode chroot+"/"+K (chroot default /fenced). In K, '/'
// and '%' become %2F and %25; the keys "." and ".." become %2E and %2E%2E.
// dial_timeout bounds each connection attempt (default 10s). tick_time is
// the ensemble's tickTime or an upper bound (default: half the servers'
// minSessionTimeout). Set it if that minimum is below two ticks.
//
// # Guarantees
//
// A lease is Curator's lock recipe: it excludes a Curator mutex on the same
// path. Waiters are served in arrival order. The
// fence is the holder node's czxid: strict across leader elections,
// restarts and recreated lock paths. Sessions expire on the leader's
// monotonic clock, so clock steps are safe.
//
// # Caveats
//
//   - The session is the lease: a TTL gets the session timeout
//     T = (TTL + tick)*8/7. A crashed holder's key is free after T.
//   - The longest TTL is maxSessionTimeout*7/8 - tick (33s under
//     ZooKeeper's defaults).
//   - After a process pause, a grant or renewal waits for a fresh
//     keep-alive. It fails with ErrUnavailable after T - TTL.
//   - A reconnect within the session keeps every lease. Session expiry, or
//     the node's deletion, ends the lease as lost.
//   - From a lock path's 2^31st node on, Curator misorders it. Recycle
//     such a path to keep sharing it with Curator.
//
// How the driver keeps a lease, and why: docs/backends.md.
package fencedzookeeper

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/fencedzookeeper/internal/zk"
	"github.com/fenced-dev/fenced/internal/backend/errclass"
	"github.com/fenced-dev/fenced/internal/backend/keyname"
	"github.com/fenced-dev/fenced/internal/backend/sessionlock"
	"github.com/fenced-dev/fenced/internal/backend/urlquery"
	"github.com/fenced-dev/fenced/internal/core/ttlrule"
)

// DefaultRoot is the parent of lock paths when the URL or Options give none.
const DefaultRoot = "/fenced"

// Options configure a Driver made with New: what a zk:// URL says, as
// fields. Servers is required; the other zero values give the defaults.
type Options struct {
	// Servers are the ensemble's client addresses, each host:port.
	Servers []string
	// Root is the parent znode of every lock path (the URL's chroot).
	// Default DefaultRoot.
	Root string
	// DialTimeout bounds each connection attempt. Default 10s.
	DialTimeout time.Duration
	// TickTime is the ensemble's tickTime (zoo.cfg), or an upper bound of
	// it. Default: half the servers' minSessionTimeout. Set it if that
	// minimum is below two ticks.
	TickTime time.Duration
}

func init() {
	fenced.Register("zk", openURL, ExpiryFor(2*time.Second)) // ZooKeeper's default tickTime
}

var nopLogger = log.New(io.Discard, "", 0)

// openACL is set on every node the driver creates: anyone may do anything,
// as under Curator's default.
var openACL = zk.WorldACL(zk.PermAll)

// openURL opens zk://host:port[,host:port...][/chroot][?dial_timeout=D].
func openURL(ctx context.Context, u *url.URL) (driver.Driver, error) {
	if u.Opaque != "" || u.Host == "" {
		return nil, fmt.Errorf("%w: ZooKeeper URL must look like zk://host:port[,host:port...][/chroot]", fenced.ErrInvalidURL)
	}
	if u.User != nil {
		return nil, fmt.Errorf("%w: ZooKeeper URLs take no user information", fenced.ErrInvalidURL)
	}
	opts := &Options{Root: strings.TrimSuffix(u.Path, "/")}
	var err error
	if opts.Servers, err = sessionlock.Endpoints(u.Host, "ZooKeeper server"); err != nil {
		return nil, err
	}
	q, err := urlquery.Parse(u.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("ZooKeeper URL: %w", err)
	}
	if opts.DialTimeout, _, err = q.TakeDuration("dial_timeout"); err != nil {
		return nil, fmt.Errorf("ZooKeeper URL: %w", err)
	}
	if opts.TickTime, _, err = q.TakeDuration("tick_time"); err != nil {
		return nil, fmt.Errorf("ZooKeeper URL: %w", err)
	}
	if err := q.NoRest("dial_timeout", "tick_time"); err != nil {
		return nil, fmt.Errorf("ZooKeeper URL: %w", err)
	}
	d, err := New(ctx, opts)
	if err != nil {
		return nil, err
	}
	return d, nil
}

// New connects to the ensemble opts names, as fenced.Open does with a
// zk:// URL. A bad server address or root matches fenced.ErrInvalidURL;
// an ensemble it cannot reach within DialTimeout, fenced.ErrUnavailable.
func New(ctx context.Context, opts *Options) (*Driver, error) {
	if opts == nil || len(opts.Servers) == 0 {
		return nil, fmt.Errorf("%w: zookeeper: New: Options.Servers is required", fenced.ErrInvalidURL)
	}
	servers, err := sessionlock.Endpoints(strings.Join(opts.Servers, ","), "ZooKeeper server")
	if err != nil {
		return nil, err
	}
	root := opts.Root
	if root == "" {
		root = DefaultRoot
	}
	if err := validRoot(root); err != nil {
		return nil, err
	}
	if opts.DialTimeout < 0 || opts.TickTime < 0 {
		return nil, fmt.Errorf("%w: zookeeper: New: Options.DialTimeout %v and TickTime %v must not be negative",
			fenced.ErrInvalidURL, opts.DialTimeout, opts.TickTime)
	}
	d := newDriver(root)
	d.servers, d.dialTimeout = servers, opts.DialTimeout
	if d.dialTimeout == 0 {
		d.dialTimeout = 10 * time.Second
	}
	fail := func(err error) (*Driver, error) {
		d.Close()
		return nil, err
	}
	tick := opts.TickTime
	if tick == 0 {
		// Ask for a tiny session timeout: the servers raise it to their
		// minSessionTimeout, which is two ticks unless configured.
		zc, err := d.connect(ctx, minProbeTimeout)
		if err != nil {
			return fail(err)
		}
		tick = zc.timeout / 2
		zc.close()
	}
	d.tick = tick
	// Probe with a very long timeout: the servers lower it to their
	// maxSessionTimeout, which bounds the TTLs we can honour. The probe
	// session then serves admin reads.
	zc, err := d.connect(ctx, time.Hour)
	if err != nil {
		return fail(err)
	}
	d.sessions[zc.timeout] = zc // closed by Close
	d.maxTTL = maxTTLFor(zc.timeout, tick)
	if d.maxTTL < ttlrule.Min {
		return fail(fmt.Errorf("zookeeper: %w: maxSessionTimeout %v leaves no TTL of at least %v with tickTime %v (see Sessions)",
			fenced.ErrInvalidTTL, zc.timeout, ttlrule.Min, tick))
	}
	return d, nil
}

func validRoot(root string) error {
	if !strings.HasPrefix(root, "/") || strings.Contains(root, "//") || strings.HasSuffix(root, "/") && root != "/" {
		return fmt.Errorf("%w: ZooKeeper chroot %q must be an absolute path like /app/locks", fenced.ErrInvalidURL, root)
	}
	for _, part := range strings.Split(root[1:], "/") {
		if part == "." || part == ".." {
			return fmt.Errorf("%w: ZooKeeper chroot %q contains %q", fenced.ErrInvalidURL, root, part)
		}
	}
	if root == "/zookeeper" || strings.HasPrefix(root, "/zookeeper/") {
		return fmt.Errorf("%w: ZooKeeper chroot %q is under /zookeeper, which ZooKeeper reserves for itself", fenced.ErrInvalidURL, root)
	}
	// ZooKeeper's own path rule (PathUtils.validatePath).
	for i, r := range root {
		if r < 0x20 || r >= 0x7f && r <= 0x9f || r >= 0xd800 && r <= 0xf8ff || r >= 0xfff0 || r == utf8.RuneError {
			return fmt.Errorf("%w: ZooKeeper chroot %q has %q at byte %d, a character ZooKeeper refuses in a path",
				fenced.ErrInvalidURL, root, r, i)
		}
	}
	return nil
}

// zsession is one ZooKeeper connection and the session it carries.
type zsession struct {
	conn    *zk.Conn
	timeout time.Duration // negotiated session timeout
	stop    chan struct{} // closed when the driver is done with the session

	mu sync.Mutex
	// expired is closed (and replaced) when the server reports the
	// session expired.
	expired chan struct{}
	// acts are the session's recently answered keep-alives (headroom.go);
	// recorded is closed (and replaced) when one is added.
	acts     []activity
	recorded chan struct{}
	// lastWrite is the latest-sent write of the session that was answered
	// (session and sent only; see recordWrite).
	lastWrite activity
}

func newZSession(conn *zk.Conn, timeout time.Duration) *zsession {
	return &zsession{conn: conn, timeout: timeout, stop: make(chan struct{}), expired: make(chan struct{}), recorded: make(chan struct{})}
}

// close stops the session's background work and closes the connection
// (its ephemeral nodes go at once).
func (s *zsession) close() {
	s.mu.Lock()
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	s.mu.Unlock()
	s.conn.Close()
}

func (s *zsession) expiredC() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.expired
}

// Driver is the ZooKeeper driver. Wrap it with fenced.NewClient. It is safe
// for concurrent use.
type Driver struct {
	root        string
	servers     []string
	dialTimeout time.Duration
	maxTTL      time.Duration
	tick        time.Duration // upper bound of the servers' tickTime

	mu       sync.Mutex
	closed   bool
	sessions map[time.Duration]*zsession // by requested TTL
	grants   *sessionlock.Grants[*entry]
	nodes    ownNodes
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup
}

func newDriver(root string) *Driver {
	ctx, cancel := context.WithCancel(context.Background())
	d := &Driver{root: root, sessions: map[time.Duration]*zsession{}, ctx: ctx, cancel: cancel}
	d.grants = sessionlock.NewGrants(d.deleteNode, func(e *entry) { d.nodes.remove(e.path, e.czxid) })
	return d
}

// timeoutConn reads the session timeout out of the server's connect
// response, the first frame on every new connection: length, protocol
// version, timeout (all big-endian int32), then the session id.
type timeoutConn struct {
	net.Conn
	buf    []byte
	done   bool
	report func(time.Duration)
}

func (c *timeoutConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if !c.done && n > 0 {
		c.buf = append(c.buf, p[:n]...)
		if len(c.buf) >= 12 {
			c.done = true
			c.report(time.Duration(int32(binary.BigEndian.Uint32(c.buf[8:12]))) * time.Millisecond)
			c.buf = nil
		}
	}
	return n, err
}

// connect opens a session asking for timeout and waits until the server
// grants it.
func (d *Driver) connect(ctx context.Context, timeout time.Duration) (*zsession, error) {
	var negotiated atomic.Int64
	dialer := func(network, addr string, to time.Duration) (net.Conn, error) {
		c, err := net.DialTimeout(network, addr, to)
		if err != nil {
			return nil, err
		}
		return &timeoutConn{Conn: c, report: func(t time.Duration) { negotiated.Store(int64(t)) }}, nil
	}
	dialed := time.Now()
	conn, events, err := zk.Connect(d.servers, timeout, zk.WithDialer(dialer), zk.WithLogger(nopLogger))
	if err != nil {
		return nil, fmt.Errorf("%w: ZooKeeper at %s: %v", fenced.ErrUnavailable, strings.Join(d.servers, ","), err)
	}
	wait, cancel := context.WithTimeout(ctx, d.dialTimeout)
	defer cancel()
	for {
		select {
		case ev := <-events:
			if ev.State != zk.StateHasSession {
				continue
			}
			zc := newZSession(conn, time.Duration(negotiated.Load()))
			// The leader registered the new session after we dialed.
			zc.record(activity{session: conn.SessionID(), sent: dialed, done: time.Now(), atLeader: true})
			d.wg.Add(2)
			go d.watchSession(zc, events)
			go d.keepAlive(zc)
			return zc, nil
		case <-wait.Done():
			conn.Close()
			return nil, fmt.Errorf("%w: cannot reach ZooKeeper at %s within %v",
				fenced.ErrUnavailable, strings.Join(d.servers, ","), d.dialTimeout)
		}
	}
}

// watchSession drains a session's events and signals its expiry.
func (d *Driver) watchSession(zc *zsession, events <-chan zk.Event) {
	defer d.wg.Done()
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				return
			}
			if ev.State == zk.StateExpired {
				zc.mu.Lock()
				close(zc.expired)
				zc.expired = make(chan struct{})
				zc.mu.Unlock()
			}
		case <-d.ctx.Done():
			return
		}
	}
}

// session returns the session for ttl, opening it if needed.
func (d *Driver) session(ctx context.Context, ttl time.Duration) (*zsession, error) {
	if ttl > d.maxTTL {
		return nil, fmt.Errorf("zookeeper: %w", errTTLTooLong(ttl, d.maxTTL))
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil, fenced.ErrClosed
	}
	if zc, ok := d.sessions[ttl]; ok {
		d.mu.Unlock()
		return zc, nil
	}
	d.mu.Unlock()
	want := sessionTimeoutFor(ttl, d.tick)
	zc, err := d.connect(ctx, want)
	if err != nil {
		return nil, err
	}
	if zc.timeout < want {
		zc.close()
		return nil, fmt.Errorf("zookeeper: %w: the servers granted a %v session where TTL %v needs %v",
			fenced.ErrInvalidTTL, zc.timeout, ttl, want)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if old, ok := d.sessions[ttl]; ok {
		zc.close()
		return old, nil
	}
	if d.closed {
		zc.close()
		return nil, fenced.ErrClosed
	}
	d.sessions[ttl] = zc
	return zc, nil
}

// guarantees is what the backend promises, the part of Capabilities
// that says how far a lease can be trusted.
func (d *Driver) guarantees() driver.Capabilities {
	return sessionlock.Capabilities("fence = czxid of the holder's znode (Zab-ordered, never reused); " +
		"the lease is the ZooKeeper session, whose timeout T = (TTL + tickTime)*8/7 outlives the holder's local validity " +
		"(TTL - margin from before the request): " +
		"the leader hears of a session's requests to a follower only at its next ping (every tickTime/2), " +
		"the driver sends a keep-alive every T/16, and a grant or renewal waits until a keep-alive answered at least a tick earlier " +
		"was sent no earlier than start + TTL - T; " +
		"a crashed holder's key is free after T; " +
		// Session expiry runs on the leader's tick clock (System.nanoTime).
		"safe from clock steps: the leader expires sessions on its tick clock, which is monotonic (System.nanoTime), not the wall clock")
}

// Capabilities implements driver.Driver: the lock recipe's FIFO queue of
// sequential znodes (a watch on the predecessor), batch renewal and loss
// watches. No TTL longer than the session timeout the server allows, which
// could not be honoured.
func (d *Driver) Capabilities() driver.Capabilities {
	keeps := ExpiryFor(d.tick)
	keeps.MaxTTL = d.maxTTL
	c := d.guarantees()
	c.Queue, c.FIFO, c.BatchRenew, c.WatchLoss, c.Keeps = true, true, true, true, keeps
	return c
}

// Close closes the driver's sessions (their ephemeral nodes go at once)
// and stops its background work.
func (d *Driver) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	d.grants.Seal()
	sessions := d.sessions
	d.mu.Unlock()
	d.cancel()
	// Closing the connections first fails requests in flight, so no end
	// the reaper is running can block Close.
	for _, zc := range sessions {
		zc.close()
	}
	d.grants.Close()
	d.wg.Wait()
	return nil
}

// lockPath returns the znode under which key's lock nodes live.
func (d *Driver) lockPath(key string) string {
	if d.root == "/" {
		return "/" + keyname.Escape(key)
	}
	return d.root + "/" + keyname.Escape(key)
}

// LockPath returns the lock path of key, as given to Curator's
// InterProcessMutex.
func (d *Driver) LockPath(key string) string { return d.lockPath(key) }

// newUUID returns a random (version 4) UUID in Curator's text form.
func newUUID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("zookeeper: crypto/rand failed: " + err.Error())
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// classify is ZooKeeper's errclass.Func: an expired session or no
// server to talk to applied nothing; any other failure may have come
// after the request was sent.
func classify(err error) error {
	if errors.Is(err, zk.ErrSessionExpired) || errors.Is(err, zk.ErrNoServer) {
		return fenced.ErrUnavailable
	}
	return fenced.ErrUnknownOutcome
}

// readErr classifies a ZooKeeper error of a request that changes nothing.
func readErr(op string, err error) error {
	return fmt.Errorf("zookeeper: %s: %w", op, errclass.Wrap(err, false, classify))
}

// transient reports whether err is a connection loss that the client
// library recovers from by reconnecting within the session.
func transient(err error) bool {
	return errors.Is(err, zk.ErrConnectionClosed) || errors.Is(err, zk.ErrNoServer)
}

// writeErr classifies the error of a request that may have been applied.
func writeErr(op string, err error) error {
	return fmt.Errorf("zookeeper: %s: %w", op, errclass.Wrap(err, true, classify))
}
