package fence

import (
	"context"
	"errors"
	"fmt"
	"math"
	"unicode"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/core/rootaccess"
	"github.com/fenced-dev/fenced/internal/core/token"
)

// Errors returned by the guards, matched with errors.Is. A refusal because a
// newer holder exists matches fenced.ErrStaleFence (ErrStale is the same
// value).
var (
	// ErrStale means the resource has recorded a newer fence for the row or
	// key, or the same fence from a different owner.
	ErrStale = fenced.ErrStaleFence
	// ErrPrecondition means the fence was acceptable but the write's own
	// precondition did not hold: typically the work was already done.
	ErrPrecondition = errors.New("fence: precondition did not hold")
	// ErrInvalidToken means a token was rejected before anything was sent.
	// Causes: an invalid key, fence zero, a fence that does not fit a
	// signed 64-bit column, an empty, overlong or non-printable owner, or a
	// malformed signature.
	ErrInvalidToken = errors.New("fence: invalid token")
	// ErrSchema means the guarded table or one of its columns is missing,
	// or an identifier is not acceptable.
	ErrSchema = errors.New("fence: schema")
	// ErrNoRow means the guarded row does not exist.
	ErrNoRow = errors.New("fence: no such row")
)

// MaxFence is the largest fence the guards accept. Fences are stored in
// signed 64-bit columns (SQL BIGINT, Redis integers, etcd values parsed as
// int64), so larger values are refused rather than wrapped.
const MaxFence = math.MaxInt64

// MaxOwnerLen bounds Token.Owner, so it fits the owner column.
const MaxOwnerLen = 64

// MaxSigLen bounds Token.Sig.
const MaxSigLen = 128

// Token is what a writer presents to a guarded resource.
//
// Tokens are not secret and, unless signed, not authenticated. Anyone who
// can reach a resource can present any key, fence and owner. A forged fence
// far above the real ones (Fenced-Fence: 9223372036854775807) would lock the
// key's real holders out of that resource for good. Where the writers are
// not all trusted, sign tokens (Signer, with a Verifier as the guard's
// Checker) or have the resource ask the lease store (Sequencer).
type Token struct {
	// Key is the lease key the fence belongs to (for example
	// "invoice:inv_72"). Fences are only comparable within one key: the
	// Redis, etcd and HTTP guards record it with the fence and refuse a
	// token for another key with ErrWrongKey.
	Key string
	// Fence is the lease's fencing token: 1..MaxFence.
	Fence uint64
	// Owner identifies the grant the fence came from. Guards record it beside
	// the fence and refuse an equal fence from a different owner, which
	// matters on backends whose fence can repeat after a failover. From fills
	// it with OwnerDigest(lease.Owner()), never the owner token itself, so a
	// resource never learns a secret that could renew or release the lease.
	Owner string
	// Sig, when not empty, is a signature of Key, Fence and Owner made by a
	// Signer ("keyid.base64url-mac"), checked by a Verifier. Guards
	// without a Verifier ignore it.
	Sig string

	// issuer is the client that granted the lease, set by From. A guard
	// without a hook of its own reports the token's stale writes to the
	// issuer's hook, so one guard serves leases of any client.
	issuer *fenced.Client
}

// From returns the token of a held lease: its key, fence and owner digest,
// unsigned (see Signer.Sign). It also remembers the client that granted the
// lease. A guard whose options set no Hook reports this token's stale writes
// to that client's Options.Hook (a guard's own Hook, when set, takes
// precedence). So one guard, created once without a hook, serves every
// worker and every client. Two tokens from From compare equal (==) when they
// come from the same client. Compare a decoded token with one built by hand
// field by field. From(nil) returns the zero Token, which Validate and every
// guard refuse with ErrInvalidToken.
func From(l *fenced.Lease) Token {
	if l == nil {
		return Token{}
	}
	return Token{Key: l.Key(), Fence: l.Fence(), Owner: OwnerDigest(l.Owner()), issuer: issuerOf(l)}
}

// issuerOf returns the client that granted l, whose hook a guard without
// one of its own reports to.
func issuerOf(l *fenced.Lease) *fenced.Client {
	c, _ := rootaccess.Client(l).(*fenced.Client)
	return c
}

// OwnerDigest returns a 32-character hex digest of an owner token: enough to
// tell grants apart, useless for renewing or releasing the lease.
// It is the digest that listings (fenced.LeaseInfo.OwnerDigest,
// fenced serve) show, so a row's recorded owner names its holder there.
func OwnerDigest(owner string) string { return token.Digest(owner) }

// Validate reports whether t can be presented to a guard. That needs a key
// accepted by fenced.ValidateKey and a fence in 1..MaxFence. The owner must
// be 1..MaxOwnerLen printable ASCII characters without spaces. The Sig must
// be empty, or of the same kind with at most MaxSigLen characters. It does
// not check the signature itself (see Verifier). Errors match
// ErrInvalidToken.
func (t Token) Validate() error {
	if err := fenced.ValidateKey(t.Key); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidToken, err)
	}
	switch {
	case t.Fence == 0:
		return fmt.Errorf("%w: fence is 0 (fences start at 1; a lease without a fence cannot write to a guarded resource)", ErrInvalidToken)
	case t.Fence > MaxFence:
		return fmt.Errorf("%w: fence %d overflows a signed 64-bit integer (max %d)", ErrInvalidToken, t.Fence, uint64(MaxFence))
	case t.Owner == "":
		return fmt.Errorf("%w: owner is empty", ErrInvalidToken)
	case len(t.Owner) > MaxOwnerLen:
		return fmt.Errorf("%w: owner is %d bytes, longer than %d", ErrInvalidToken, len(t.Owner), MaxOwnerLen)
	case len(t.Sig) > MaxSigLen:
		return fmt.Errorf("%w: signature is %d bytes, longer than %d", ErrInvalidToken, len(t.Sig), MaxSigLen)
	}
	if i := badTokenByte(t.Owner); i >= 0 {
		return fmt.Errorf("%w: owner has a space, control or non-ASCII byte at %d", ErrInvalidToken, i)
	}
	if i := badTokenByte(t.Sig); i >= 0 {
		return fmt.Errorf("%w: signature has a space, control or non-ASCII byte at %d", ErrInvalidToken, i)
	}
	return nil
}

// badTokenByte returns the index of the first byte of s that is not
// printable ASCII or is a space, or -1.
func badTokenByte(s string) int {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c > unicode.MaxASCII || c <= ' ' || c == 0x7f {
			return i
		}
	}
	return -1
}

// String describes t without the full owner or the signature.
func (t Token) String() string {
	return fmt.Sprintf("%s fence=%d owner=%s", t.Key, t.Fence, token.Short(t.Owner))
}

// admits reports whether a resource whose newest recorded write carries
// (fence, owner) accepts a write from t: t's fence is newer, or equal with
// the same owner (the same holder writing again).
func (t Token) admits(fence uint64, owner string) bool {
	return t.Fence > fence || (t.Fence == fence && t.Owner == owner)
}

type tokenCtxKey struct{}

// WithToken returns a context carrying t, for the HTTP Transport and for
// handlers behind Middleware.
func WithToken(ctx context.Context, t Token) context.Context {
	return context.WithValue(ctx, tokenCtxKey{}, t)
}

// WithLease returns a context carrying From(l). Requests made with it through
// a Transport carry the lease's key and fence.
func WithLease(ctx context.Context, l *fenced.Lease) context.Context {
	return WithToken(ctx, From(l))
}

// TokenFrom returns the token carried by ctx, if any.
func TokenFrom(ctx context.Context) (Token, bool) {
	t, ok := ctx.Value(tokenCtxKey{}).(Token)
	return t, ok
}

// Outcome classifies a guarded write.
type Outcome int

const (
	// Applied: the write happened and the row now records the writer's fence.
	Applied Outcome = iota + 1
	// Stale: nothing changed because the resource has recorded a newer fence
	// (or the same fence from another owner). Result.Current holds it.
	Stale
	// PreconditionFailed: the fence was acceptable but the write's own
	// condition did not hold (for example the work was already done).
	// Nothing changed.
	PreconditionFailed
)

// String returns "applied", "stale" or "precondition failed".
func (o Outcome) String() string {
	switch o {
	case Applied:
		return "applied"
	case Stale:
		return "stale"
	case PreconditionFailed:
		return "precondition failed"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Result is the outcome of a guarded write. The caller never has to re-read
// the resource to know why a write did not apply.
type Result struct {
	Outcome Outcome
	// Current is the fence the resource holds after the call: the writer's
	// own when Applied, the newer one when Stale, and the unchanged older
	// (or equal) one when PreconditionFailed.
	Current uint64
	// SameFenceOtherOwner is set on a Stale result caused by an equal fence
	// presented by a different owner: the fence source repeated a number,
	// as an asynchronously replicated authority can after a failover.
	SameFenceOtherOwner bool
	// Presented is the fence of the token the write carried (0 when the
	// guard did not say).
	Presented uint64
}

// Applied reports whether the write happened.
func (r Result) Applied() bool { return r.Outcome == Applied }

// Err returns nil when the write was applied and otherwise an error matching
// ErrStale or ErrPrecondition, describing what the resource holds.
func (r Result) Err() error {
	switch r.Outcome {
	case Applied:
		return nil
	case Stale:
		if r.SameFenceOtherOwner {
			return fmt.Errorf("%w: fence %d was already used by another owner", ErrStale, r.Current)
		}
		return fmt.Errorf("%w: resource has fence %d%s", ErrStale, r.Current, restartHint(r.Presented, r.Current))
	case PreconditionFailed:
		return fmt.Errorf("%w (resource fence %d)", ErrPrecondition, r.Current)
	}
	return fmt.Errorf("fence: invalid outcome %d", int(r.Outcome))
}

// classify turns what the resource holds after a write that did not apply
// into a Result.
func classify(t Token, fence uint64, owner string) Result {
	switch {
	case fence > t.Fence:
		return Result{Outcome: Stale, Current: fence, Presented: t.Fence}
	case fence == t.Fence && owner != t.Owner:
		return Result{Outcome: Stale, Current: fence, SameFenceOtherOwner: true, Presented: t.Fence}
	}
	return Result{Outcome: PreconditionFailed, Current: fence, Presented: t.Fence}
}

// report sends a stale refusal to the guard's hook h or, when h is nil,
// to the hook of the client that issued t.
func report(h func(fenced.Event), t Token, r Result, resource string) {
	if r.Outcome != Stale {
		return
	}
	if h == nil && t.issuer != nil {
		h = t.issuer.Options().Hook
	}
	if h != nil {
		h(fenced.Event{Kind: fenced.EventStaleWrite, Key: t.Key, Fence: t.Fence, Current: r.Current, Resource: resource})
	}
}
