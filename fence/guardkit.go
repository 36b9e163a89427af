package fence

import (
	"context"

	"github.com/fenced-dev/fenced"
)

// The pieces below are for guards that live in their own packages, one per
// client library (fence/redisfence, fence/etcdfence, fence/pgxfence), so
// that package fence links no client library: a SQL-only program imports
// neither go-redis nor etcd's client. A guard for another store uses them
// the same way.

// Admits reports whether a resource whose newest recorded write carries
// (fence, owner) accepts a write from t. That is when t's fence is newer,
// or equal with the same owner (the same holder writing again).
func (t Token) Admits(fence uint64, owner string) bool { return t.admits(fence, owner) }

// Refusal turns what a resource holds after a write of t that did not
// apply (its recorded fence and owner) into a Result. It is Stale when
// the fence is newer (or equal with another owner), else
// PreconditionFailed.
func Refusal(t Token, fence uint64, owner string) Result { return classify(t, fence, owner) }

// ReportStale sends a Stale result r for resource to the guard's hook h
// or, when h is nil, to the hook of the client that
// issued t. Other outcomes are not reported.
func ReportStale(h func(fenced.Event), t Token, r Result, resource string) { report(h, t, r, resource) }

// CheckKey returns an error matching ErrWrongKey unless token, the lease
// key a token carries, equals bound, the key a resource is bound to.
func CheckKey(bound, token string) error { return checkKey(bound, token) }

// Prechecks are the checks a guard runs before it sends anything. The
// token is valid, for the lease key LeaseKey derives from the resource
// (when set), and accepted by Check (when set).
type Prechecks struct {
	LeaseKey func(resource string) string
	Check    Checker
}

// Run runs the checks for a write of t to resource.
func (c Prechecks) Run(ctx context.Context, resource string, t Token) error {
	return tokenChecks{leaseKey: c.LeaseKey, check: c.Check}.run(ctx, resource, t)
}
