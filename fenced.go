// Package fenced grants leases on keys with fencing tokens, keeps them
// renewed, and cancels the holder's work the moment a lease is lost.
//
// Three parties take part in every protected operation:
//
//   - the authority (a store the user already runs) grants a lease on a key
//     for a limited time, with a fence: a uint64 that strictly increases on
//     every grant of that key and is never reissued;
//   - the worker holds a *Lease: fenced renews it, measures its validity on
//     the local monotonic clock, and cancels Lease.Context with a cause when
//     the lease is lost or can no longer be trusted;
//   - the protected resource receives the fence with every write and refuses
//     writes from an older generation (package fence has guards for SQL,
//     Redis, etcd and HTTP). A paused process cannot be stopped by any
//     client-side check; only the resource can refuse it.
//
// Stores are opened by URL, like database/sql, after importing the backend
// package for its side effect:
//
//	import _ "github.com/fenced-dev/fenced/fencedsqlite"
//
//	client, err := fenced.Open(ctx, "sqlite:///var/lib/app/leases.db", nil)
//
// The backends in this module and their schemes: mem (mem:), sqlite
// (sqlite:), postgres (postgres:, postgresql:), mysql (mysql:), redis
// (redis:, rediss:), redlock (redlock:), etcd (etcd:), zookeeper (zk:) and
// dynamodb (dynamodb:). The root package imports none of them; Open on a
// scheme whose package is not linked in says so and lists the registered
// ones.
//
// Every backend declares its Guarantees (fence strength, whose clock
// decides expiry, whether a clock step is safe). A lease is refused on a
// backend whose fence is weaker than its LeaseOptions.MinFence. That is
// strict unless the lease (or Options.MinFence) names a weaker one:
// FenceRepeatable, or FenceNone for work that needs no fence. Only a lease
// that accepts no fence may FailOpen.
//
// # Recipes
//
// Package recipe builds election, semaphore and multi-key locking on the
// public API of this package only, so users can write recipes of their
// own the same way. Client.Options, Client.Capabilities, Client.List,
// Client.Watch and Client.Value with Lease.SetValue are what it needs
// besides leases.
//
// # Operators
//
// Client.List, Client.Break, Client.Breaks, Client.FenceFloor,
// Client.RaiseFenceFloor and Client.Prune are the operator's side of a
// store. Operations a store lacks return ErrUnsupported.
//
// # Errors
//
// Errors match the sentinels below with errors.Is and are wrapped once with
// the operation and key. ErrHeld and ErrNotHeld are refusals; ErrUnavailable
// means nothing reached the authority; ErrUnknownOutcome means a request may
// or may not have been applied.
package fenced

import (
	"context"
	"fmt"
	"net/url"
	"reflect"
	"sort"
	"strings"
	"sync"

	"github.com/fenced-dev/fenced/driver"
)

// Sentinel errors that drivers return; see package driver for their
// meaning. Bad input (a key, a TTL, a URL) also matches ErrInvalidOptions or
// ErrInvalidKey, driver.ErrInvalidTTL and driver.ErrInvalidURL.
var (
	ErrHeld           = driver.ErrHeld
	ErrNotHeld        = driver.ErrNotHeld
	ErrLost           = driver.ErrLost
	ErrClosed         = driver.ErrClosed
	ErrUnavailable    = driver.ErrUnavailable
	ErrUnknownOutcome = driver.ErrUnknownOutcome
	ErrNotFound       = driver.ErrNotFound
	ErrUnsupported    = driver.ErrUnsupported
	ErrInvalidKey     = driver.ErrInvalidKey
)

// FenceStrength (declared in each backend's Guarantees), LeaseInfo and
// HeldError (what TryAcquire's ErrHeld knows of the holder's remaining
// time): see package driver.
type (
	FenceStrength = driver.FenceStrength
	LeaseInfo     = driver.LeaseInfo
	HeldError     = driver.HeldError
)

// Fence strengths, weakest first. A zero LeaseOptions.MinFence takes
// Options.MinFence.
const (
	FenceNone       = driver.FenceNone
	FenceRepeatable = driver.FenceRepeatable
	FenceStrict     = driver.FenceStrict
)

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

// defaultMux is the mux behind Register, Schemes, ExpiryOf and Open: the
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
// dashboard of `fenced serve` figure with it without connecting (ExpiryOf).
// A zero keeps says the authority ends a grant exactly at its TTL.
//
// Register panics if open is nil or the scheme is registered twice, like
// sql.Register.
func Register(scheme string, open func(ctx context.Context, u *url.URL) (driver.Driver, error), keeps driver.Expiry) {
	defaultMux.register(scheme, backend{open: open, keeps: keeps})
}

// ExpiryOf returns the Expiry registered with the backend of scheme
// (case-insensitive). It is false when no linked-in package registered the
// scheme.
func ExpiryOf(scheme string) (driver.Expiry, bool) {
	b, ok := defaultMux.lookup(scheme)
	return b.keeps, ok
}

// Schemes returns the registered schemes, sorted.
func Schemes() []string { return defaultMux.schemes() }

// Open opens the store named by rawURL with the backend registered for its
// scheme and returns a Client over it. opts may be nil.
//
// Malformed URLs and unknown schemes return errors matching driver.ErrInvalidURL.
// An unknown scheme's error lists the registered ones and names the
// package to import: the root package knows no backend by name. The
// password in a URL never appears in errors.
func Open(ctx context.Context, rawURL string, opts *Options) (*Client, error) {
	return defaultMux.open(ctx, rawURL, opts)
}

// open is Open on m.
func (m *urlMux) open(ctx context.Context, rawURL string, opts *Options) (*Client, error) {
	u, err := driver.ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	b, ok := m.lookup(u.Scheme)
	if !ok {
		return nil, fmt.Errorf("fenced: open %s: %w: unknown scheme %q: no backend registered for it (registered: %s); "+
			"import the package that registers it for its side effect (fenced's own backends are packages under %s/, "+
			"listed with their schemes in the package documentation)",
			driver.Redact(rawURL), driver.ErrInvalidURL, u.Scheme, registeredSchemes(m), modulePath)
	}
	drv, err := b.open(ctx, u)
	if err != nil {
		return nil, fmt.Errorf("fenced: open %s: %w", driver.Redact(rawURL), err)
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
