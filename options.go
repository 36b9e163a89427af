package fenced

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/fenced-dev/fenced/clock"
	"github.com/fenced-dev/fenced/driver"
)

// Limits applied to every key and TTL before a driver sees them.
const (
	// MaxKeyLen is the longest key accepted, in bytes.
	MaxKeyLen = 256
	// MinTTL is the shortest lease accepted.
	MinTTL = 10 * time.Millisecond
	// MaxTTL is the longest lease accepted. Longer work should renew.
	MaxTTL = 7 * 24 * time.Hour
	// DefaultTTL is the TTL of a lease whose options and client defaults
	// name none.
	DefaultTTL = 30 * time.Second
	// DefaultCloseTimeout bounds Client.Close when Options.CloseTimeout is
	// not set.
	DefaultCloseTimeout = 5 * time.Second
)

// Sentinel durations for LeaseOptions.MaxWait and LeaseOptions.MaxHold.
// Zero in those fields means "inherit", so saying "do not wait" or "no cap"
// over a client default that says otherwise needs a value of its own. They
// are the extreme durations, so a wait or cap computed from a clock (which
// is an error when negative) cannot produce one by accident.
const (
	// NoWait, as MaxWait, fails at once with ErrHeld when the key is held.
	// It is the package default.
	NoWait time.Duration = math.MinInt64
	// WaitForever, as MaxWait, waits for a held key until the context ends.
	WaitForever time.Duration = math.MaxInt64
	// HoldForever, as MaxHold, lets automatic renewal keep the lease for as
	// long as the holder wants it. It is the package default.
	HoldForever time.Duration = math.MaxInt64
)

// Switch is an on/off lease option whose zero value, Inherit, takes the
// client's default (Options.Defaults), then the package default. A lease
// says On or Off to override a client default either way.
type Switch uint8

const (
	// Inherit takes the client's default, then the package default.
	Inherit Switch = iota
	// On turns the option on, whatever the client's default says.
	On
	// Off turns the option off, whatever the client's default says.
	Off
)

// String returns "inherit", "on" or "off".
func (s Switch) String() string {
	switch s {
	case Inherit:
		return "inherit"
	case On:
		return "on"
	case Off:
		return "off"
	}
	return fmt.Sprintf("Switch(%d)", uint8(s))
}

// ParseFenceStrength parses a minimum fence strength as the CLI and
// configuration files write it: "strict", "repeatable" (or its full name
// "repeatable-after-failover") or "none". Errors match ErrInvalidOptions.
func ParseFenceStrength(s string) (FenceStrength, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "strict":
		return FenceStrict, nil
	case "repeatable", FenceRepeatable.String():
		return FenceRepeatable, nil
	case "none":
		return FenceNone, nil
	}
	return FenceUnset, fmt.Errorf("%w: fence strength %q: want strict, repeatable or none", ErrInvalidOptions, s)
}

// Options configure a Client. The zero value (or nil) gives the defaults.
type Options struct {
	// Clock measures local validity and drives timers. Default: clock.Real().
	Clock clock.Clock
	// Hooks observe acquisitions, renewals, losses and releases.
	Hooks Hooks
	// Defaults stand in for the fields a LeaseOptions leaves at their zero
	// value ("inherit"). A field the lease sets always wins; see
	// LeaseOptions for how the two are combined.
	Defaults LeaseOptions
	// MinBackoff and MaxBackoff bound the full-jitter backoff of polling
	// waiters. Defaults: 10ms and 1s.
	MinBackoff, MaxBackoff time.Duration
	// FallbackPoll caps the sleep of a notified waiter between checks, for
	// grants that expire without a release and notifications lost in
	// transit. Default: 2s.
	FallbackPoll time.Duration
	// CloseTimeout bounds Close, on the real clock: how long it waits for
	// the authority to confirm the releases of the leases still held and
	// for requests in flight. Zero or negative means DefaultCloseTimeout.
	CloseTimeout time.Duration
}

// LeaseOptions configure one lease. Every field's zero value means
// "inherit": the client's Options.Defaults supply it, then the package
// default. Set a field to choose explicitly; explicit values of their own
// (NoWait, HoldForever, Off, ...) exist wherever the zero value could
// otherwise be mistaken for a choice.
//
// Resolution follows three rules, so that a lease gets what it says:
//
//   - A field set on the lease wins over the client's default for it.
//   - A client default that contradicts a choice the lease made yields to
//     it: FailOpen On in the defaults is dropped for a lease whose MinFence
//     is stronger than FenceNone, and a default RenewEvery that is not
//     shorter than the lease's own TTL gives way to TTL/3.
//   - Nothing weakens the fence unless it is named: no option implies a
//     lower MinFence, so FailOpen On with a fence required is an error,
//     not a silent downgrade.
//
// Combinations that cannot be honoured are errors naming the field and
// where its value came from (this lease, Options.Defaults or the package
// default); they match ErrInvalidOptions, and ErrInvalidTTL as well for
// durations. Client.Resolve gives the resulting LeaseSpec without
// acquiring anything.
//
// This replaces an earlier design with a Purpose (Correctness or
// Efficiency) and AllowRepeatableFence/AllowNoFence booleans: the zero
// Purpose could not be told from "unset", so a client default of
// Efficiency turned an explicit Correctness lease into one that failed
// open, and booleans could only be turned on by a default, never back off.
type LeaseOptions struct {
	// TTL is how long the authority keeps the lease without renewal.
	// Default 30s; must be within [MinTTL, MaxTTL] and the backend's bounds.
	TTL time.Duration
	// MaxWait is how long Acquire and Do wait for a held key: NoWait (the
	// default) fails at once with ErrHeld, WaitForever waits until the
	// context ends, a positive duration waits that long. Other negative
	// values are errors. TryAcquire never waits.
	MaxWait time.Duration
	// MinFence is the weakest fence the lease accepts: FenceStrict (the
	// default) for work whose stale writes the resource must refuse;
	// FenceRepeatable to accept a fence that can repeat after a failover
	// (single-node Redis with replicas); FenceNone for work that needs no
	// fence (a duplicate only wastes effort) or that the caller fences
	// itself. A backend with a weaker fence is refused with ErrNoFence.
	// FenceUnset (the zero value) inherits.
	MinFence FenceStrength
	// FailOpen On runs the work without a lease when the authority is
	// unavailable: the lease reports FailedOpen, excludes nobody and has
	// fence zero. It is allowed only with MinFence FenceNone, since a lease
	// that fails open has no fence. Default Off.
	FailOpen Switch
	// AutoRenew Off turns automatic renewal off: the lease ends when its
	// TTL runs out unless the holder calls Renew. Default On.
	AutoRenew Switch
	// RenewEvery is the automatic renewal period. Default TTL/3; it must be
	// shorter than the local validity (TTL minus SafetyMargin). Ignored when
	// AutoRenew is Off.
	RenewEvery time.Duration
	// MaxHold caps the total time automatic renewal may keep the lease;
	// after it, renewal stops and the lease expires. HoldForever (the
	// default) sets no cap.
	MaxHold time.Duration
	// SafetyMargin is subtracted from the TTL for local validity, to allow
	// for clock drift between worker and authority and for the round trip.
	// Default TTL/100 + 2ms; it must be shorter than the TTL. Backends whose
	// own grant decision needs a drift allowance (Redlock) use this one.
	SafetyMargin time.Duration
}

// LeaseSpec is the final, validated terms of one lease: what Client.Resolve
// returns and what the Client, its renewer and the backend act on. Every
// field is explicit; nothing in a LeaseSpec inherits.
type LeaseSpec struct {
	// TTL is how long the authority keeps the lease without renewal.
	TTL time.Duration
	// MaxWait is NoWait, WaitForever or a positive duration.
	MaxWait time.Duration
	// MinFence is FenceNone, FenceRepeatable or FenceStrict, and the
	// backend's fence is at least that strong.
	MinFence FenceStrength
	// FailOpen is true only when MinFence is FenceNone.
	FailOpen bool
	// AutoRenew says whether the client renews the lease by itself.
	AutoRenew bool
	// RenewEvery is the renewal period, shorter than TTL-SafetyMargin; zero
	// when AutoRenew is false.
	RenewEvery time.Duration
	// MaxHold is HoldForever or a positive cap on renewal.
	MaxHold time.Duration
	// SafetyMargin is positive and shorter than TTL.
	SafetyMargin time.Duration
}

// validity is how long local validity lasts from the moment a request was
// sent.
func (s LeaseSpec) validity() time.Duration { return s.TTL - s.SafetyMargin }

func (s LeaseSpec) terms() driver.Terms {
	return driver.Terms{TTL: s.TTL, SafetyMargin: s.SafetyMargin}
}

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
		return "client default, Options.Defaults"
	}
	return "package default"
}

// pick returns the lease's value unless it is the zero value (inherit),
// then the client default's, then def.
func pick[T comparable](lease, client, def T) (T, origin) {
	var zero T
	switch {
	case lease != zero:
		return lease, fromLease
	case client != zero:
		return client, fromClient
	}
	return def, fromPackage
}

// invalid returns an error matching ErrInvalidOptions (and ErrInvalidTTL
// for durations) about field, whose value came from o.
func invalid(duration bool, field string, o origin, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if duration {
		return fmt.Errorf("%w: %w: %s (%s): %s", ErrInvalidOptions, ErrInvalidTTL, field, o, msg)
	}
	return fmt.Errorf("%w: %s (%s): %s", ErrInvalidOptions, field, o, msg)
}

// Resolve combines opts (nil means all inherit) with c's defaults and the
// package defaults, validates the result against the rules LeaseOptions
// describes and the backend's guarantees, and returns the spec a lease
// acquired with opts would get. It is the one place lease policy is
// decided; Acquire, TryAcquire and Do call it first. Errors match
// ErrInvalidOptions (and ErrInvalidTTL for durations), or ErrNoFence when
// the backend's fence is weaker than MinFence.
func (c *Client) Resolve(opts *LeaseOptions) (LeaseSpec, error) {
	var l LeaseOptions
	if opts != nil {
		l = *opts
	}
	d := c.opts.Defaults
	var s LeaseSpec

	var ttlFrom origin
	s.TTL, ttlFrom = pick(l.TTL, d.TTL, DefaultTTL)
	if err := c.validateTTL(s.TTL); err != nil {
		return LeaseSpec{}, fmt.Errorf("%w: TTL (%s): %w", ErrInvalidOptions, ttlFrom, err)
	}

	var from origin
	s.MaxWait, from = pick(l.MaxWait, d.MaxWait, NoWait)
	if s.MaxWait < 0 && s.MaxWait != NoWait {
		return LeaseSpec{}, invalid(true, "MaxWait", from, "%v is negative; use NoWait or WaitForever", s.MaxWait)
	}

	var fenceFrom origin
	s.MinFence, fenceFrom = pick(l.MinFence, d.MinFence, FenceStrict)
	if s.MinFence < FenceNone || s.MinFence > FenceStrict {
		return LeaseSpec{}, invalid(false, "MinFence", fenceFrom, "%v is not FenceNone, FenceRepeatable or FenceStrict", s.MinFence)
	}

	switch {
	case !validSwitch(l.FailOpen):
		return LeaseSpec{}, invalid(false, "FailOpen", fromLease, "%v is not Inherit, On or Off", l.FailOpen)
	case !validSwitch(d.FailOpen):
		return LeaseSpec{}, invalid(false, "FailOpen", fromClient, "%v is not Inherit, On or Off", d.FailOpen)
	case l.FailOpen == On || (l.FailOpen == Inherit && d.FailOpen == On):
		failOpenFrom := fromLease
		if l.FailOpen == Inherit {
			failOpenFrom = fromClient
		}
		switch {
		case s.MinFence == FenceNone:
			s.FailOpen = true
		case failOpenFrom == fromClient && fenceFrom == fromLease:
			// The lease asked for a fence; the client's fail-open default
			// cannot apply to it.
			s.FailOpen = false
		default:
			return LeaseSpec{}, invalid(false, "FailOpen", failOpenFrom,
				"On needs MinFence FenceNone, since a lease that fails open has no fence, but MinFence is %v (%s)", s.MinFence, fenceFrom)
		}
	}

	autoRenew, from := pick(l.AutoRenew, d.AutoRenew, On)
	if !validSwitch(autoRenew) {
		return LeaseSpec{}, invalid(false, "AutoRenew", from, "%v is not Inherit, On or Off", autoRenew)
	}
	s.AutoRenew = autoRenew == On

	var marginFrom origin
	s.SafetyMargin, marginFrom = pick(l.SafetyMargin, d.SafetyMargin, driver.DefaultSafetyMargin(s.TTL))
	if s.SafetyMargin < 0 || s.SafetyMargin >= s.TTL {
		return LeaseSpec{}, invalid(true, "SafetyMargin", marginFrom, "%v must be positive and shorter than the TTL %v (%s)", s.SafetyMargin, s.TTL, ttlFrom)
	}

	if l.RenewEvery < 0 {
		return LeaseSpec{}, invalid(true, "RenewEvery", fromLease, "%v is negative", l.RenewEvery)
	}
	if s.AutoRenew {
		var renewFrom origin
		s.RenewEvery, renewFrom = pick(l.RenewEvery, d.RenewEvery, s.TTL/3)
		if renewFrom == fromClient && ttlFrom == fromLease && s.RenewEvery >= s.validity() {
			// A default period made for a longer TTL yields to the TTL
			// this lease chose.
			s.RenewEvery, renewFrom = s.TTL/3, fromPackage
		}
		if s.RenewEvery <= 0 || s.RenewEvery >= s.validity() {
			return LeaseSpec{}, invalid(true, "RenewEvery", renewFrom,
				"%v must be positive and shorter than the local validity %v (TTL %v minus SafetyMargin %v), or the lease expires before it is renewed",
				s.RenewEvery, s.validity(), s.TTL, s.SafetyMargin)
		}
	}

	s.MaxHold, from = pick(l.MaxHold, d.MaxHold, HoldForever)
	if s.MaxHold < 0 {
		return LeaseSpec{}, invalid(true, "MaxHold", from, "%v is negative; use HoldForever for no cap", s.MaxHold)
	}

	if err := c.checkFence(s.MinFence, fenceFrom); err != nil {
		return LeaseSpec{}, err
	}
	return s, nil
}

func validSwitch(s Switch) bool { return s <= Off }

// checkFence refuses a backend whose fence is weaker than min, telling the
// user which value accepts it.
func (c *Client) checkFence(min FenceStrength, from origin) error {
	g := c.drv.Guarantees()
	have := max(g.Fence, FenceNone) // an undeclared strength is none
	if have >= min {
		return nil
	}
	switch have {
	case FenceRepeatable:
		return fmt.Errorf("%w: this backend's fence is %s (%s), weaker than MinFence %v (%s); set MinFence to FenceRepeatable to accept it, or FenceNone for work that needs no fence",
			ErrNoFence, have, g.Note, min, from)
	default:
		return fmt.Errorf("%w: this backend issues no fencing token (%s), but MinFence is %v (%s); set MinFence to FenceNone for work that needs no fence or that you fence yourself",
			ErrNoFence, g.Note, min, from)
	}
}

// ValidateKey reports whether key is acceptable to every backend: non-empty,
// at most MaxKeyLen bytes of valid UTF-8, printable, with no leading or
// trailing space. Errors match ErrInvalidKey.
func ValidateKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: key is empty", ErrInvalidKey)
	case len(key) > MaxKeyLen:
		return fmt.Errorf("%w: key is %d bytes, longer than %d", ErrInvalidKey, len(key), MaxKeyLen)
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

func (c *Client) validateTTL(ttl time.Duration) error {
	lo, hi := MinTTL, MaxTTL
	lo, hi = c.ops().TTLBounds(lo, hi)
	return driver.CheckTTL(ttl, lo, hi)
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
