package fenced

import (
	"fmt"
	"github.com/fenced-dev/fenced/internal/core/limits"
	"math"
	"math/rand/v2"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/fenced-dev/fenced/clock"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/core/capability"
	"github.com/fenced-dev/fenced/internal/core/ttlrule"
)

const (
	// defaultCloseTimeout bounds Client.Close when Options.CloseTimeout is
	// not set.
	defaultCloseTimeout = 5 * time.Second
)

// WaitForever is the LeaseOptions.MaxWait that waits for a held key until
// the context ends. A zero MaxWait does not wait.
const WaitForever time.Duration = math.MaxInt64

// holdForever is a resolved MaxHold that sets no cap: the largest
// Duration, so a zero MaxHold resolves to it.
const holdForever time.Duration = math.MaxInt64

// Options configure a Client. The zero value (or nil) gives the defaults.
type Options struct {
	// Clock measures local validity and drives timers. Default:
	// clock.Real(), which on Linux counts the time the machine spends
	// suspended (CLOCK_BOOTTIME).
	Clock clock.Clock
	// Hook, if set, receives an Event for every acquisition, attempt,
	// renewal, loss, release and refused stale write. It runs on the
	// client's goroutines and must not block.
	Hook func(Event)
	// MinFence is the weakest fence a lease accepts when its own MinFence
	// is zero. Default: FenceStrict. A lease's own MinFence wins.
	MinFence FenceStrength
	// MinBackoff and MaxBackoff bound the full-jitter backoff of polling
	// waiters. Defaults: 10ms and 1s.
	MinBackoff, MaxBackoff time.Duration
	// FallbackPoll caps the sleep of a notified waiter between checks, for
	// grants that expire without a release and notifications lost in
	// transit. Default: 2s.
	FallbackPoll time.Duration
	// CloseTimeout bounds Close, on the real clock: how long it waits for
	// the authority to confirm the releases of the leases still held and
	// for requests in flight. Zero or negative means 5s.
	CloseTimeout time.Duration
}

// LeaseOptions configure one lease. Every zero value is the safe
// default: a strict fence, no wait, automatic renewal, no fail-open.
// Client.Resolve fills in the defaults and checks the result; invalid
// combinations match ErrInvalidOptions (and ErrInvalidTTL for durations).
// docs/design.md explains the rules.
type LeaseOptions struct {
	// TTL is how long the authority keeps the lease without renewal.
	// Default 30s; must be from 10ms to 7 days (longer work renews) and
	// the backend's bounds (Capabilities().Keeps). Resolve checks both.
	TTL time.Duration
	// MaxWait is how long Acquire and Do wait for a held key. Zero (the
	// default) fails at once with ErrHeld. WaitForever waits until the context
	// ends. A positive duration waits that long, then asks once more
	// (the key may have come free while this process was stopped) before
	// it fails with ErrHeld. TryAcquire never waits.
	MaxWait time.Duration
	// MinFence is the weakest fence the lease accepts. FenceStrict is for
	// work whose stale writes the resource must refuse. FenceRepeatable
	// accepts a fence that can repeat after a failover. FenceNone is for
	// work that needs no fence. A backend with a weaker fence is refused
	// with ErrNoFence. Zero takes Options.MinFence.
	MinFence FenceStrength
	// FailOpen runs the work without a lease when the authority is
	// unavailable: the lease reports FailedOpen, excludes nobody and has
	// fence zero. It needs MinFence FenceNone.
	FailOpen bool
	// ManualRenew turns automatic renewal off: the lease ends when its TTL
	// runs out unless the holder calls Renew.
	ManualRenew bool
	// RenewEvery is the automatic renewal period. Default TTL/3; it must be
	// shorter than the local validity (TTL minus SafetyMargin). Ignored
	// with ManualRenew.
	RenewEvery time.Duration
	// MaxHold caps the total time automatic renewal may keep the lease;
	// after it, renewal stops and the lease expires. Zero sets no cap;
	// Resolve reports it as the largest Duration (math.MaxInt64).
	MaxHold time.Duration
	// MinHold keeps the lease, renewed, until at least this long after
	// the grant, even when the work ends sooner. Do returns only then. A
	// duplicate of a short periodic job, started a little later elsewhere,
	// then finds the key held and skips. The lease's end or the caller's
	// context cuts the hold short. Default 0 (none). It must not exceed
	// MaxHold. With ManualRenew it must be shorter than the local validity.
	MinHold time.Duration
	// SafetyMargin is subtracted from the TTL for local validity, to allow
	// for clock drift and the round trip. Default TTL/100 + 2ms; it must
	// be shorter than the TTL. Redlock also uses it as its drift allowance.
	SafetyMargin time.Duration
	// OwnerTag, if set, starts every owner token of the lease, before its
	// 128 random bits, so that a listing's shortened owner (its first 8
	// characters, LeaseInfo.Owner) says who holds the key:
	// recipe.Partitions tags its leases with its member. At most 8
	// characters, lowercase letters and digits only. It
	// is no secret: the random bits keep the token unguessable.
	OwnerTag string
}

// maxOwnerTagLen is the longest LeaseOptions.OwnerTag: what a shortened
// owner shows.
const maxOwnerTagLen = 8

// validity is how long local validity lasts from the moment a request was
// sent.
func (s LeaseOptions) validity() time.Duration { return s.TTL - s.SafetyMargin }

// origin says where a resolved value came from, for error messages.
type origin int

const (
	fromPackage origin = iota
	fromClient
	fromLease
)

func (o origin) String() string {
	switch o {
	case fromLease:
		return "set on the lease"
	case fromClient:
		return "client default, Options.MinFence"
	}
	return "package default"
}

// Resolve returns the options a lease acquired with opts (nil for none)
// would get: every default filled in and checked against the backend's
// guarantees. Acquire, TryAcquire and Do call it first. Errors match
// ErrInvalidOptions (and ErrInvalidTTL for durations), or ErrNoFence when
// the backend's fence is weaker than MinFence.
func (c *Client) Resolve(opts *LeaseOptions) (LeaseOptions, error) {
	var s LeaseOptions
	if opts != nil {
		s = *opts
	}
	if s.TTL == 0 {
		s.TTL = ttlrule.Default
	}
	if lo, hi := capability.TTLBounds(c.ops().Declared, ttlrule.Min, ttlrule.Max); s.TTL < lo || s.TTL > hi {
		return LeaseOptions{}, invalid(true, "TTL", "%v is outside [%v, %v], the TTLs this store accepts", s.TTL, lo, hi)
	}
	if err := checkOwnerTag(s.OwnerTag); err != nil {
		return LeaseOptions{}, err
	}
	if s.MaxWait < 0 {
		return LeaseOptions{}, invalid(true, "MaxWait", "%v is negative; use 0 (no wait) or WaitForever", s.MaxWait)
	}

	fenceFrom := fromLease
	switch {
	case s.MinFence != fenceUnset:
	case c.opts.MinFence != fenceUnset:
		s.MinFence, fenceFrom = c.opts.MinFence, fromClient
	default:
		s.MinFence, fenceFrom = FenceStrict, fromPackage
	}
	if s.MinFence < FenceNone || s.MinFence > FenceStrict {
		return LeaseOptions{}, fmt.Errorf("%w: MinFence (%s): %v is not FenceNone, FenceRepeatable or FenceStrict",
			ErrInvalidOptions, fenceFrom, s.MinFence)
	}
	if s.FailOpen && s.MinFence != FenceNone {
		return LeaseOptions{}, invalid(false, "FailOpen",
			"it needs MinFence FenceNone, since a lease that fails open has no fence, but MinFence is %v (%s)", s.MinFence, fenceFrom)
	}

	if s.SafetyMargin == 0 {
		s.SafetyMargin = ttlrule.DefaultSafetyMargin(s.TTL)
	}
	if s.SafetyMargin < 0 || s.SafetyMargin >= s.TTL {
		return LeaseOptions{}, invalid(true, "SafetyMargin", "%v must be positive and shorter than the TTL %v", s.SafetyMargin, s.TTL)
	}

	if s.RenewEvery < 0 {
		return LeaseOptions{}, invalid(true, "RenewEvery", "%v is negative", s.RenewEvery)
	}
	switch {
	case s.ManualRenew:
		s.RenewEvery = 0
	case s.RenewEvery == 0:
		s.RenewEvery = s.TTL / 3
		fallthrough
	default:
		if s.RenewEvery >= s.validity() {
			return LeaseOptions{}, invalid(true, "RenewEvery",
				"%v must be shorter than the local validity %v (TTL %v minus SafetyMargin %v), or the lease expires before it is renewed",
				s.RenewEvery, s.validity(), s.TTL, s.SafetyMargin)
		}
	}

	if s.MaxHold < 0 {
		return LeaseOptions{}, invalid(true, "MaxHold", "%v is negative; use 0 for no cap", s.MaxHold)
	}
	if s.MaxHold == 0 {
		s.MaxHold = holdForever
	}
	if err := s.checkMinHold(); err != nil {
		return LeaseOptions{}, err
	}

	if err := c.checkFence(s.MinFence, fenceFrom); err != nil {
		return LeaseOptions{}, err
	}
	return s, nil
}

// checkOwnerTag refuses an OwnerTag that is too long or not lowercase
// letters and digits.
func checkOwnerTag(tag string) error {
	if len(tag) > maxOwnerTagLen {
		return invalid(false, "OwnerTag", "%q is %d characters, more than %d", tag, len(tag), maxOwnerTagLen)
	}
	for _, r := range tag {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') {
			return invalid(false, "OwnerTag", "%q has %q; want lowercase letters and digits", tag, r)
		}
	}
	return nil
}

// checkFence refuses a backend whose fence is weaker than min, telling the
// user which value accepts it.
func (c *Client) checkFence(min FenceStrength, from origin) error {
	g := c.drv.Capabilities()
	have := max(g.Fence, FenceNone) // an undeclared strength is none
	if have >= min {
		return nil
	}
	switch have {
	case FenceRepeatable:
		return fmt.Errorf("%w: this backend's fence is %s (%s), weaker than MinFence %v (%s); accept it: FenceRepeatable, or FenceNone",
			ErrNoFence, have, g.Note, min, from)
	default:
		return fmt.Errorf("%w: this backend issues no fencing token (%s), but MinFence is %v (%s); set MinFence to FenceNone",
			ErrNoFence, g.Note, min, from)
	}
}

// ValidateKey reports whether key is acceptable to every backend: non-empty,
// at most 256 bytes of valid UTF-8, printable, with no leading or
// trailing space. Errors match ErrInvalidKey.
func ValidateKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: key is empty", ErrInvalidKey)
	case len(key) > limits.MaxKeyLen:
		return fmt.Errorf("%w: key is %d bytes, longer than %d", ErrInvalidKey, len(key), limits.MaxKeyLen)
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: key %q is not valid UTF-8", ErrInvalidKey, key)
	}
	for i, r := range key {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("%w: key %q has a non-printable character at byte %d", ErrInvalidKey, key, i)
		}
	}
	if unicode.IsSpace(rune(key[0])) || unicode.IsSpace(rune(key[len(key)-1])) {
		return fmt.Errorf("%w: key %q has leading or trailing space", ErrInvalidKey, key)
	}
	return nil
}

// backoff returns the sleep before poll attempt n (0-based): full jitter
// over an exponentially growing cap.
func (c *Client) backoff(n int) time.Duration {
	lo, hi := c.opts.MinBackoff, c.opts.MaxBackoff
	ceil := lo << min(n, 20)
	if ceil > hi || ceil <= 0 {
		ceil = hi
	}
	return lo/2 + rand.N(ceil)
}

// checkMinHold checks s.MinHold against the rest of s (MaxHold,
// ManualRenew and the local validity must already be resolved).
func (s *LeaseOptions) checkMinHold() error {
	switch {
	case s.MinHold < 0:
		return invalid(true, "MinHold", "%v is negative", s.MinHold)
	case s.MinHold > 0 && s.MaxHold != holdForever && s.MinHold > s.MaxHold:
		return invalid(true, "MinHold", "%v is longer than MaxHold %v, after which renewal stops and the lease expires",
			s.MinHold, s.MaxHold)
	case s.MinHold > 0 && s.ManualRenew && s.MinHold >= s.validity():
		return invalid(true, "MinHold",
			"%v is not shorter than the local validity %v with ManualRenew: the lease would end before the hold",
			s.MinHold, s.validity())
	}
	return nil
}

// Fence strengths, weakest first; see FenceStrength. The zero value
// (fenceUnset) is none of them: a zero LeaseOptions.MinFence takes
// Options.MinFence.
const (
	// FenceNone: the backend issues no monotonic token (Redlock, advisory
	// locks). The fence reported to users is zero.
	FenceNone FenceStrength = iota + 1
	// FenceRepeatable: strictly increasing while the authority's data
	// survives. But a failover or a restart without persistence can issue
	// a fence again (asynchronously replicated Redis).
	FenceRepeatable
	// FenceStrict: strictly increasing and never reissued, across restarts
	// and (where the backend replicates by consensus) failover.
	FenceStrict
)

// fenceUnset is the zero FenceStrength: a MinFence that names none, or a
// backend that declared none.
const fenceUnset FenceStrength = 0

// FenceStrength is the fence a backend declares in its Capabilities and
// the weakest a lease accepts (LeaseOptions.MinFence). See package driver.
type FenceStrength = driver.FenceStrength
