// Package driver defines the interface that fenced backends implement.
//
// Users do not call drivers directly: they hold a *fenced.Client, which
// wraps a Driver and adds every piece of policy (waiting with backoff or by
// notification, renewal, local validity, cancellation on loss, hooks).
// A driver does one atomic thing per call against its authority and never
// retries; the split follows gocloud.dev's portable type + driver design and
// database/sql/driver.
//
// Every driver must pass the conformance suite in package drivertest against
// a real server.
//
// # Contract
//
//   - A key is granted to at most one owner at a time, as judged by the
//     authority's own clock (or, for a store without one, by the waiter's
//     observation; see Capabilities.ServerClock).
//   - Every grant of a key returns a fence strictly greater than every fence
//     previously returned for that key (within the strength declared by
//     Capabilities.Fence). Releasing, expiring or breaking a grant never lowers
//     the counter.
//   - TryAcquire by the owner that currently holds the key (same owner token,
//     grant not expired) is idempotent: it returns the same fence and extends
//     the expiry. This makes a retry after ErrUnknownOutcome safe.
//   - Renew and Release succeed only when both owner and fence match the
//     current, unexpired grant (Release may also succeed on an expired grant
//     that nobody else took, since it changes nothing observable).
//   - Errors are the sentinels of package fenced (fenced.ErrHeld and the
//     rest; this package's docs name them without the prefix), wrapped
//     with detail. A driver distinguishes "refused" (ErrHeld, ErrNotHeld)
//     from "could not reach the authority" (ErrUnavailable) and "the
//     request may or may not have been applied" (ErrUnknownOutcome). A
//     driver names the sentinel of its client library's errors (the
//     backends of this module share the rules in internal/backend/errclass).
//   - A grant carries the TTL it was made with (Grant.TTL); a renewal
//     renews it for that TTL. Every TTL reaches the authority rounded up
//     to the authority's unit, never shortened.
package driver

import (
	"context"
	"fmt"
	"time"
)

// Grant identifies one grant of a key. It holds the key, the owner token
// that proves ownership and the fence issued with it, and the TTL it was
// granted for.
type Grant struct {
	Key   string
	Owner string
	Fence uint64
	// TTL is how long the authority keeps the grant without renewal: the
	// TTL it was granted with, which every renewal grants again (Renew,
	// RenewBatch). The portable layer sets it from the lease's terms. It
	// plays no part in identifying the grant: a driver matches key, owner
	// and fence only.
	TTL time.Duration
}

// String describes g without revealing the whole owner token.
func (g Grant) String() string {
	return fmt.Sprintf("%s fence=%d owner=%s", g.Key, g.Fence, shortOwner(g.Owner))
}

// LeaseInfo is what an admin sees of a key.
type LeaseInfo struct {
	Key string
	// Held reports whether an unexpired grant exists.
	Held bool
	// Owner is the holder's owner token, shortened to its first 8
	// characters and "…". Empty when not held.
	Owner string
	// OwnerDigest is the digest of the holder's full owner token that a
	// fence guard records beside the fence (fence.OwnerDigest), so an
	// admin can match a holder to the writes a resource accepted from it.
	// It is safe to show anywhere. Empty when not held, and for holders that are not
	// fenced clients (an etcdctl lock, a Curator mutex).
	OwnerDigest string
	// Fence is the fence of the current grant, or of the last grant when the
	// key is free (zero when never granted).
	Fence uint64
	// Remaining is the time left on the grant by the authority's clock (zero
	// when not held, or when the backend's leases are sessions without a
	// deadline of their own). Without a server clock it is what is left of
	// the inspecting driver's watch of the grant (a whole TTL at its first
	// look), and Held means that driver has not yet seen the grant
	// unchanged for its TTL.
	Remaining time.Duration
}

// BreakRecord is the audit record a driver keeps of a break, where it can.
type BreakRecord struct {
	Time   time.Time
	Key    string
	Fence  uint64
	Owner  string // shortened
	Reason string
	By     string
}

// FenceStrength says how far a backend's fence can be trusted. Its values
// are declared once, in package fenced, weakest first: fenced.FenceNone,
// FenceRepeatable and FenceStrict, so "at least as strong as" is >=. A
// backend names them there, as it does the sentinel errors. The zero value
// is no strength at all: a zero fenced.LeaseOptions.MinFence takes the
// client's Options.MinFence, and a zero Capabilities.Fence means the
// backend did not declare one, which the portable layer treats as
// FenceNone.
type FenceStrength int

// String returns the strength's name as used in docs and CLI output:
// "none", "repeatable-after-failover", "strict", or "unset" for zero.
func (s FenceStrength) String() string {
	names := [...]string{"unset", "none", "repeatable-after-failover", "strict"}
	if s >= 0 && int(s) < len(names) {
		return names[s]
	}
	return fmt.Sprintf("FenceStrength(%d)", int(s))
}

// Driver is the interface a backend implements. All methods must be safe
// for concurrent use. Keys and TTLs reaching a driver have been validated by
// the portable layer. Drivers may impose tighter limits of their own and
// report them wrapped in ErrInvalidKey or ErrInvalidTTL.
type Driver interface {
	// TryAcquire grants key to owner for ttl if the key is free or its grant
	// has expired by the authority's clock, and returns the new fence. If
	// owner already holds the key the call returns the current fence and
	// extends the grant. Otherwise it returns an error matching ErrHeld
	// (preferably a *fenced.HeldError) and changes nothing.
	TryAcquire(ctx context.Context, key, owner string, ttl time.Duration) (fence uint64, err error)
	// Renew extends g by g.TTL from now (authority's clock). It returns an
	// error matching ErrNotHeld if g is not the current unexpired grant.
	// g.TTL is the TTL the grant was made with; a backend whose grants
	// ride on sessions of a fixed TTL (etcd leases, ZooKeeper sessions)
	// renews the session.
	Renew(ctx context.Context, g Grant) error
	// Release ends g, keeping the key's fence counter. It returns an error
	// matching ErrNotHeld if g is not the current grant; it never removes
	// another owner's grant.
	Release(ctx context.Context, g Grant) error
	// Inspect describes key. A key never granted returns ErrNotFound.
	Inspect(ctx context.Context, key string) (LeaseInfo, error)
	// List returns the held leases whose keys start with prefix, sorted by
	// key.
	List(ctx context.Context, prefix string) ([]LeaseInfo, error)
	// Break ends the current grant of key whoever holds it, so the holder's
	// next renewal fails and the next grant gets a higher fence. It returns
	// what was broken, or an error matching ErrNotHeld if nothing was held.
	// reason and by say why and who, for the break log (BreakLogger).
	Break(ctx context.Context, key, reason, by string) (LeaseInfo, error)
	// Capabilities declares, once, what the backend promises and the
	// optional operations the driver offers; fenced.Client.Capabilities
	// reports them to users.
	Capabilities() Capabilities
	// Close releases the driver's resources. Grants are left to expire.
	Close() error
}

// Subscription delivers wake-ups for one key.
type Subscription interface {
	// C receives a value (coalesced) whenever the key may have become free.
	C() <-chan struct{}
	// Close ends the subscription.
	Close() error
}

// WakeForwarder is implemented by Subscriptions that wake one waiter per
// release instead of every waiter of the key (a head-of-line waiter, one
// pub/sub wake-up per process). There a wake-up that its waiter consumed but
// did not act on would be lost with it. The other waiters would sleep until
// their fallback timers. The portable client may give up (context done,
// MaxWait, Close) after it took a wake-up, and before a look at the store
// showed the key held again. It then calls Forward before Close. Forward
// hands the wake-up on to the next waiter of the key, as Close does with one
// that was never taken.
type WakeForwarder interface {
	Forward()
}

// Notifier is implemented by drivers whose authority can tell waiters that a
// key was released or broken (LISTEN/NOTIFY, pub/sub, watches). The portable
// layer subscribes before trying, so a release between a failed try and the
// wait is not missed. It keeps a fallback timer for grants that expire
// without a release.
type Notifier interface {
	Subscribe(ctx context.Context, key string) (Subscription, error)
}

// TimedQueuer is implemented by drivers whose authority keeps a native FIFO
// wait queue (etcd and ZooKeeper recipes). The portable layer then waits in
// that queue instead of polling. AcquireTimed blocks until owner is granted
// key or ctx is done. On ctx end it must leave nothing queued behind. Since
// a wait can outlast the TTL, it also returns when the request that
// confirmed the grant was sent, on the local monotonic clock. That request
// found owner first in the queue with its session alive. The grant's
// validity is measured from that moment instead of from the start of the
// wait. So the driver must have made sure that the authority keeps the grant
// for ttl from then, for example by a session keep-alive sent no earlier.
type TimedQueuer interface {
	AcquireTimed(ctx context.Context, key, owner string, ttl time.Duration) (fence uint64, confirmed time.Time, err error)
}

// TermsAcquirer is implemented by drivers whose decision to grant depends on
// a lease's terms beyond its TTL. Redlock accepts a majority only if TTL
// minus the time the round took minus the drift allowance is still positive.
// It takes the lease's safety margin as that allowance. So the driver's check
// and the holder's local validity are the same arithmetic. The portable
// layer calls TryAcquireTerms instead of TryAcquire. It must behave as
// TryAcquire with ttl in every other respect.
type TermsAcquirer interface {
	// TryAcquireTerms is TryAcquire with the lease's resolved safety
	// margin: what the portable layer subtracts from ttl for the holder's
	// local validity. The margin is positive and shorter than ttl.
	TryAcquireTerms(ctx context.Context, key, owner string, ttl, margin time.Duration) (fence uint64, err error)
}

// BatchRenewer is implemented by drivers that renew many grants in one
// round trip. RenewBatch renews each grant as Renew does (for its own TTL)
// and returns one error per grant, in order (nil for renewed, ErrNotHeld
// for not held). A non-nil second result means the whole batch failed and
// errs is nil.
type BatchRenewer interface {
	RenewBatch(ctx context.Context, grants []Grant) (errs []error, err error)
}

// LossWatcher is implemented by drivers that learn of a lost grant without
// being asked (an etcd or ZooKeeper session expiring, a key deleted by an
// admin). WatchLoss watches g, a grant this driver made, and calls lost
// once, with an error matching ErrLost, when it learns that g is lost. The
// watch lasts until stop is called (or the driver is closed). After stop
// returns lost is not called. lost may be called from any goroutine; it
// must not block, nor call stop. A grant the driver does not hold fails
// with ErrNotHeld.
//
// The Client watches a lease only once it has been held for a while. So a
// driver need not make a watch cheap to set up. It should make a watch cheap
// to keep (no goroutine per watched grant), since a client may hold a great
// many leases.
type LossWatcher interface {
	WatchLoss(g Grant, lost func(error)) (stop func(), err error)
}

// BreakLogger is implemented by drivers that keep an audit log of breaks.
type BreakLogger interface {
	// Breaks returns the recorded breaks of key, oldest first; with key ""
	// it returns all of them.
	Breaks(ctx context.Context, key string) ([]BreakRecord, error)
}

// Valuer is implemented by drivers whose grants carry a value that anyone
// can read along with the holder. That is the proclaimed value of an
// election (recipe.Leadership.SetValue). etcd's election recipe keeps it in
// the holder's key itself, so `etcdctl elect` and fenced see each other's
// proclamations. Backends without such a slot do not implement it, and
// recipe.Election then refuses a value with ErrUnsupported.
type Valuer interface {
	// SetValue sets the value of g, which must be the current grant of its
	// key; otherwise it returns an error matching ErrNotHeld and changes
	// nothing. The value lives as long as the grant.
	SetValue(ctx context.Context, g Grant, value string) error
	// Value returns key's current holder as Inspect describes it, and the
	// value of its grant ("" when the holder set none). A key that is not
	// held returns Held false and no value; a key never granted returns
	// ErrNotFound, as Inspect does.
	Value(ctx context.Context, key string) (LeaseInfo, string, error)
}

// shortOwner is owner cut to 8 characters, as LeaseInfo.Owner shows it.
func shortOwner(owner string) string {
	if len(owner) <= 8 {
		return owner
	}
	return owner[:8] + "…"
}
