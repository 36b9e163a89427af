package fenced

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"reflect"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fenced-dev/fenced/clock"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/core/capability"
	"github.com/fenced-dev/fenced/internal/core/rootaccess"
	"github.com/fenced-dev/fenced/internal/core/storeurl"
	"github.com/fenced-dev/fenced/internal/core/token"
)

// The module's own tools reach a client's driver, guards a lease's
// client, and the CLI the registered backends through rootaccess; none of
// them is part of the public API.
func init() {
	rootaccess.Set(rootaccess.Root{
		Driver:     func(c any) driver.Driver { return c.(*Client).drv },
		Client:     func(l any) any { return l.(*Lease).c },
		ValidUntil: func(l any) time.Time { return l.(*Lease).validUntilTime() },
		Schemes:    defaultMux.schemes,
		ExpiryOf:   expiryOf,
		PauseRenewals: func(c any) func() {
			return c.(*Client).renew.pause()
		},
		ScheduleDelays: func(c any) (late, busy time.Duration) {
			r := c.(*Client).renew
			return time.Duration(r.late.Swap(0)), time.Duration(r.busy.Swap(0))
		},
	})
}

// Client is the portable handle on a lease store. It is safe for concurrent
// use; open one per process and store and share it. Close it to release its
// leases and connections.
type Client struct {
	drv   driver.Driver
	opts  Options
	clock clock.Clock
	// epoch is c's clock when c was made. Leases keep their moments as
	// durations since it (see since), which are smaller than time.Time
	// values and keep the monotonic reading of a real clock.
	epoch time.Time

	renew *renewer

	// closing is cancelled when Close begins: waits end, and a grant that
	// arrives afterwards is released instead of handed out.
	closing      context.Context
	beginClosing context.CancelFunc
	// halt is cancelled when Close stops waiting for the store (after
	// Options.CloseTimeout) or has finished: requests still in flight are
	// abandoned then.
	halt       context.Context
	cancelHalt context.CancelCauseFunc
	closeDone  chan struct{} // closed when the first Close returns

	mu        sync.Mutex
	closed    bool
	inflight  sync.WaitGroup                     // acquisitions admitted before Close began
	acquiring map[uint64]context.CancelCauseFunc // their requests' contexts, by admission
	admitted  uint64                             // admissions so far, the keys of acquiring
	wakeups   map[string]chan struct{}           // local release signals, per waited-for key
	waiting   map[string]int                     // waiters per key; wakeups entries live while > 0

	// releases counts releases through c, and waiters the entries of
	// waiting, so that a release need not take mu when nobody waits, and
	// a waiter can tell whether a release happened before it registered.
	releases atomic.Uint64
	waiters  atomic.Int64
}

// NewClient returns a Client over drv, for backends opened with their typed
// constructors. opts may be nil. The Client owns drv and closes it on Close.
// Options.MinFence is checked when a lease is acquired (or by Resolve).
func NewClient(drv driver.Driver, opts *Options) *Client {
	c := &Client{
		drv:       drv,
		acquiring: map[uint64]context.CancelCauseFunc{},
		wakeups:   map[string]chan struct{}{},
		waiting:   map[string]int{},
		closeDone: make(chan struct{}),
	}
	if opts != nil {
		c.opts = *opts
	}
	if c.opts.Clock == nil {
		c.opts.Clock = clock.Real()
	}
	if c.opts.MinBackoff <= 0 {
		c.opts.MinBackoff = 10 * time.Millisecond
	}
	if c.opts.MaxBackoff < c.opts.MinBackoff {
		c.opts.MaxBackoff = max(time.Second, c.opts.MinBackoff)
	}
	if c.opts.FallbackPoll <= 0 {
		c.opts.FallbackPoll = 2 * time.Second
	}
	if c.opts.CloseTimeout <= 0 {
		c.opts.CloseTimeout = defaultCloseTimeout
	}
	c.clock = c.opts.Clock
	c.epoch = c.clock.Now()
	c.closing, c.beginClosing = context.WithCancel(context.Background())
	c.halt, c.cancelHalt = context.WithCancelCause(context.Background())
	c.renew = newRenewer(c)
	return c
}

// ops returns the optional operations of the client's driver: the one
// place where the portable layer asks what its driver can do. Every
// optional call goes through it.
func (c *Client) ops() capability.Ops { return capability.Of(c.drv) }

// Capabilities reports what the backend promises (Fence, ServerClock,
// ClockStepSafe, Note) and what the store can do beyond leases: a flag is
// set only where the backend declares the operation and has its methods. The
// doors that need one (Value and Lease.SetValue, Watch, Breaks,
// FenceFloor, RaiseFenceFloor, Prune) return an error matching
// ErrUnsupported where its flag is off. Keeps says how long the store may
// keep a grant after its holder's last renewal (Keeps.Outlives).
func (c *Client) Capabilities() driver.Capabilities { return c.ops().Declared }

// Options returns the options c was made with, defaults filled in. A
// recipe reads its Clock, its Hook, its backoff bounds, and its
// CloseTimeout to bound a release made after the caller's context has
// ended.
func (c *Client) Options() Options { return c.opts }

// since returns t as a duration since c.epoch: c's timeline, on which
// leases keep their moments.
func (c *Client) since(t time.Time) time.Duration { return t.Sub(c.epoch) }

// at returns the moment d of c's timeline as a time.
func (c *Client) at(d time.Duration) time.Time { return c.epoch.Add(d) }

// now returns c's clock now, on c's timeline.
func (c *Client) now() time.Duration { return c.since(c.clock.Now()) }

// newOwner returns 128 random bits, hex encoded.
func newOwner() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("fenced: crypto/rand failed: " + err.Error())
	}
	return hex.EncodeToString(b[:])
}

// LeaseInfo describes a key's holder, as Inspect returns it. See package
// driver.
type LeaseInfo = driver.LeaseInfo

// Inspect describes key as the authority sees it. The owner is shortened.
// A key never granted returns an error matching ErrNotFound.
func (c *Client) Inspect(ctx context.Context, key string) (LeaseInfo, error) {
	if err := ValidateKey(key); err != nil {
		return LeaseInfo{}, fmt.Errorf("fenced: inspect: %w", err)
	}
	info, err := c.drv.Inspect(ctx, key)
	if err != nil {
		return shortOwner(info), fmt.Errorf("fenced: inspect %q: %w", key, err)
	}
	return shortOwner(info), nil
}

// shortOwner makes sure that no owner token leaves Inspect whole,
// whatever the driver reported: drivers shorten owners already
// (internal/core/token), and token.Short leaves a shortened owner as it
// is.
func shortOwner(info LeaseInfo) LeaseInfo {
	info.Owner = token.Short(info.Owner)
	return info
}

// Value returns key's holder as Inspect describes it, and the value its
// grant carries (Lease.SetValue): "" when the holder set none. A key that
// is not held has Held false and no value; a key never granted returns an
// error matching ErrNotFound. Stores without a value slot
// (Capabilities().Value false) return ErrUnsupported; use Inspect there.
func (c *Client) Value(ctx context.Context, key string) (LeaseInfo, string, error) {
	if err := ValidateKey(key); err != nil {
		return LeaseInfo{}, "", fmt.Errorf("fenced: value: %w", err)
	}
	v := c.ops().Valuer
	if v == nil {
		return LeaseInfo{}, "", fmt.Errorf("fenced: value of %q: %w: the store has no value slot", key, ErrUnsupported)
	}
	info, value, err := v.Value(ctx, key)
	if err != nil {
		return shortOwner(info), "", fmt.Errorf("fenced: value of %q: %w", key, err)
	}
	return shortOwner(info), value, nil
}

// Watch returns a channel that receives (coalesced) whenever the store
// tells that key may have been released or broken, until ctx ends; the
// channel is not closed then. A watcher never takes the wake-up a release
// gives the waiters of key, so it suits an observer that does not try for
// the key. Stores that cannot tell observers (Capabilities().Observe
// false) return ErrUnsupported; read the key on a timer there.
func (c *Client) Watch(ctx context.Context, key string) (<-chan struct{}, error) {
	if err := ValidateKey(key); err != nil {
		return nil, fmt.Errorf("fenced: watch: %w", err)
	}
	obs := c.ops().Observer
	if obs == nil {
		return nil, fmt.Errorf("fenced: watch %q: %w: the store cannot tell observers", key, ErrUnsupported)
	}
	sub, err := obs.SubscribeObserver(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("fenced: watch %q: %w", key, err)
	}
	context.AfterFunc(ctx, func() { _ = sub.Close() })
	return sub.C(), nil
}

// opener opens a driver for a store URL. Backends register one per scheme.
type opener = func(ctx context.Context, u *url.URL) (driver.Driver, error)

// backend is what a backend registers for a scheme: its opener and how its
// authority keeps a grant no longer renewed.
type backend struct {
	open  opener
	keeps driver.Expiry
}

// urlMux maps URL schemes to the backends that open them, like gocloud's
// URLMux. The zero value is an empty mux, ready to use. It is safe for
// concurrent use.
type urlMux struct {
	mu       sync.RWMutex
	backends map[string]backend
}

// defaultMux is the mux behind Register and Open: the
// only package-level state.
var defaultMux urlMux

// register makes a backend available under a URL scheme on m. It panics
// if open is nil or the scheme is registered twice, like sql.Register.
// Schemes are case-insensitive.
func (m *urlMux) register(scheme string, b backend) {
	m.mu.Lock()
	defer m.mu.Unlock()
	scheme = strings.ToLower(scheme)
	if b.open == nil {
		panic("fenced: Register opener is nil for scheme " + scheme)
	}
	if _, dup := m.backends[scheme]; dup {
		panic("fenced: Register called twice for scheme " + scheme)
	}
	if m.backends == nil {
		m.backends = map[string]backend{}
	}
	m.backends[scheme] = b
}

// schemes returns the schemes registered on m, sorted.
func (m *urlMux) schemes() []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	var s []string
	for k := range m.backends {
		s = append(s, k)
	}
	sort.Strings(s)
	return s
}

// lookup returns the backend of scheme (case-insensitive), and false if
// none registered it.
func (m *urlMux) lookup(scheme string) (backend, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	b, ok := m.backends[strings.ToLower(scheme)]
	return b, ok
}

// Register makes a backend available under a URL scheme (case-insensitive).
// A backend package calls it from its init function, once per scheme.
//
// open opens a driver for a URL of the scheme. keeps is how the backend's
// authority keeps a grant no longer renewed: the Expiry its driver rounds
// TTLs with (and declares in Capabilities.Keeps). `fenced plan` and the
// dashboard of `fenced serve` figure with it without connecting.
// A zero keeps says the authority ends a grant exactly at its TTL.
//
// Register panics if open is nil or the scheme is registered twice, like
// sql.Register.
func Register(scheme string, open func(ctx context.Context, u *url.URL) (driver.Driver, error), keeps driver.Expiry) {
	defaultMux.register(scheme, backend{open: open, keeps: keeps})
}

// expiryOf returns the Expiry registered with the backend of scheme
// (case-insensitive). It is false when no linked-in package registered the
// scheme.
func expiryOf(scheme string) (driver.Expiry, bool) {
	b, ok := defaultMux.lookup(scheme)
	return b.keeps, ok
}

// Open opens the store named by rawURL with the backend registered for its
// scheme and returns a Client over it. opts may be nil.
//
// Malformed URLs and unknown schemes return errors matching ErrInvalidURL.
// An unknown scheme's error lists the registered ones and names the
// package to import: the root package knows no backend by name. The
// password in a URL never appears in errors.
func Open(ctx context.Context, rawURL string, opts *Options) (*Client, error) {
	return defaultMux.open(ctx, rawURL, opts)
}

// open is Open on m.
func (m *urlMux) open(ctx context.Context, rawURL string, opts *Options) (*Client, error) {
	u, err := storeurl.Parse(rawURL)
	if err != nil {
		return nil, err
	}
	b, ok := m.lookup(u.Scheme)
	if !ok {
		// The backends are packages under modulePath/, listed with their
		// schemes in the package documentation.
		return nil, fmt.Errorf("fenced: open %s: %w: unknown scheme %q (registered: %s); import its backend: packages under %s/",
			storeurl.Redact(rawURL), ErrInvalidURL, u.Scheme, registeredSchemes(m), modulePath)
	}
	drv, err := b.open(ctx, u)
	if err != nil {
		return nil, fmt.Errorf("fenced: open %s: %w", storeurl.Redact(rawURL), err)
	}
	return NewClient(drv, opts), nil
}

// modulePath is this package's import path, which fenced's own backend
// packages sit under; it is read from a type rather than written out, so
// the root names no backend.
var modulePath = reflect.TypeOf(urlMux{}).PkgPath()

// registeredSchemes lists m's schemes for an error message.
func registeredSchemes(m *urlMux) string {
	if s := m.schemes(); len(s) > 0 {
		return strings.Join(s, ", ")
	}
	return "none"
}

// Close ends every lease still held through c and closes the driver. Later
// calls on c return ErrClosed; a second Close waits for the first and
// returns nil.
//
// In order: new acquisitions are refused, and waiters give up with
// ErrClosed. Every lease's context is cancelled with ErrClosed before any
// key is freed, so no work under a lease is live once another client can
// hold its key. Then the leases are released at the authority, in
// parallel. A grant that completes while Close runs is released, not
// handed out: its Acquire returns ErrClosed.
//
// Close waits for the store at most Options.CloseTimeout (real time),
// plus the driver's own Close once no request is in flight. If the store
// has not answered by then, Close returns an error matching
// ErrUnknownOutcome. Every lease's context is cancelled all the same.
// Grants whose release was not confirmed expire at the authority within
// their TTL, and the driver is closed once its requests return.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		<-c.closeDone
		return nil
	}
	c.closed = true
	c.beginClosing()
	c.mu.Unlock()
	// No lease joins the schedule once closed is set (see register).
	held := c.renew.held()
	defer close(c.closeDone)
	bound := time.AfterFunc(c.opts.CloseTimeout, c.haltRequests)
	defer bound.Stop()

	// Cancel every lease's context first, then free the keys.
	var ended []*Lease
	for _, l := range held {
		if l.end(ErrClosed) {
			ended = append(ended, l)
		}
	}
	renewerDone := c.renew.stop()
	settled := make(chan struct{})
	go func() {
		inParallel(min(len(ended), maxReleasers), len(ended), func(i int) { _ = ended[i].free(c.halt) })
		c.inflight.Wait() // acquisitions release what they were granted
		<-renewerDone
		close(settled)
	}()
	select {
	case <-settled:
	case <-c.halt.Done():
		select {
		case <-settled:
		default:
			go func() {
				<-settled
				_ = c.drv.Close()
			}()
			// Every lease's context is cancelled; a grant whose release
			// was not confirmed expires at the authority within its TTL.
			return fmt.Errorf("fenced: close: %w: no answer from the store within CloseTimeout %v; unconfirmed grants expire by their TTL",
				ErrUnknownOutcome, c.opts.CloseTimeout)
		}
	}
	c.haltRequests()
	return c.drv.Close()
}

// maxReleasers bounds the releases Close sends at once.
const maxReleasers = 64

// haltRequests abandons every request still in flight: Close has stopped
// waiting for the store, or is over.
func (c *Client) haltRequests() {
	c.cancelHalt(ErrClosed)
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cancel := range c.acquiring {
		cancel(ErrClosed)
	}
}

// admit registers an acquisition with c, so that Close waits for it, or
// reports ErrClosed once Close has begun. It returns the context for the
// acquisition's requests to the store: ctx, also cancelled when Close stops
// waiting for the store. The caller passes the returned id and cancel to
// finish when the acquisition is over.
//
// A ctx that can never be cancelled (context.Background and the like) needs
// no context of its own: its requests run under c.halt, with ctx's values.
func (c *Client) admit(ctx context.Context) (dctx context.Context, id uint64, cancel context.CancelCauseFunc, err error) {
	if _, hasDeadline := ctx.Deadline(); ctx.Done() == nil && !hasDeadline {
		dctx = haltable{Context: c.halt, values: ctx}
	} else {
		dctx, cancel = context.WithCancelCause(ctx)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		if cancel != nil {
			cancel(nil)
		}
		return nil, 0, nil, ErrClosed
	}
	c.inflight.Add(1)
	if cancel != nil {
		c.admitted++
		id = c.admitted
		c.acquiring[id] = cancel
	}
	return dctx, id, cancel, nil
}

// finish ends an acquisition that admit admitted.
func (c *Client) finish(id uint64, cancel context.CancelCauseFunc) {
	if cancel != nil {
		c.mu.Lock()
		delete(c.acquiring, id)
		c.mu.Unlock()
		cancel(nil)
	}
	c.inflight.Done()
}

// haltable is c.halt (done, with cause ErrClosed, when Close stops waiting
// for the store) with the values of a context that is never done.
type haltable struct {
	context.Context
	values context.Context
}

// Value implements context.Context: values' values, and c.halt's for the
// keys values has nothing for (c.halt has none of its own, but
// context.Cause finds its cause this way).
func (h haltable) Value(key any) any {
	if v := h.values.Value(key); v != nil {
		return v
	}
	return h.Context.Value(key)
}

// register puts l on c's schedule, which Close ends, unless Close has
// begun.
func (c *Client) register(l *Lease) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.renew.add(l)
	return true
}

// releaseOrphan releases a grant that arrived after Close began and
// returns the error its acquisition reports.
func (c *Client) releaseOrphan(g driver.Grant) error {
	if err := c.drv.Release(c.halt, g); err != nil {
		return fmt.Errorf("%w: closed as the grant (fence %d) arrived; its release failed, so it expires by its TTL: %v",
			ErrClosed, g.Fence, err)
	}
	return fmt.Errorf("%w: the client was closed as the grant (fence %d) arrived; it was released", ErrClosed, g.Fence)
}
