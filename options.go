package fenced

import (
	"fmt"
	"math/rand/v2"
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
	// DefaultTTL is used when LeaseOptions.TTL is zero.
	DefaultTTL = 30 * time.Second
)

// WaitForever, as LeaseOptions.MaxWait, waits for a held key until the
// context ends.
const WaitForever time.Duration = -1

// Purpose says what a lease protects. See Kleppmann's distinction: an
// efficiency lease avoids duplicate harmless work; a correctness lease
// protects an invariant and needs a fence the resource checks.
type Purpose int

const (
	// Correctness is the default: the backend must give a strict fence
	// (unless AllowRepeatableFence or AllowNoFence says otherwise) and the
	// lease never fails open.
	Correctness Purpose = iota
	// Efficiency leases may use any backend and may fail open.
	Efficiency
)

// String returns "correctness" or "efficiency".
func (p Purpose) String() string {
	if p == Efficiency {
		return "efficiency"
	}
	return "correctness"
}

// Options configure a Client. The zero value (or nil) gives the defaults.
type Options struct {
	// Clock measures local validity and drives timers. Default: clock.Real().
	Clock clock.Clock
	// Hooks observe acquisitions, renewals, losses and releases.
	Hooks Hooks
	// Defaults fill the zero fields of LeaseOptions passed to Acquire,
	// TryAcquire and Do.
	Defaults LeaseOptions
	// MinBackoff and MaxBackoff bound the full-jitter backoff of polling
	// waiters. Defaults: 10ms and 1s.
	MinBackoff, MaxBackoff time.Duration
	// FallbackPoll caps the sleep of a notified waiter between checks, for
	// grants that expire without a release and notifications lost in
	// transit. Default: 2s.
	FallbackPoll time.Duration
}

// LeaseOptions configure one lease. Zero fields take the client's
// Options.Defaults, then the package defaults.
type LeaseOptions struct {
	// TTL is how long the authority keeps the lease without renewal.
	// Default 30s; must be within [MinTTL, MaxTTL] and the backend's bounds.
	TTL time.Duration
	// MaxWait is how long Acquire and Do wait for a held key: zero means do
	// not wait (fail at once with ErrHeld), WaitForever means until ctx ends.
	MaxWait time.Duration
	// Purpose is Correctness (the default) or Efficiency.
	Purpose Purpose
	// AllowRepeatableFence lets a correctness lease use a backend whose fence
	// can repeat after a failover (single-node Redis with replicas).
	AllowRepeatableFence bool
	// AllowNoFence lets a correctness lease use a backend with no fence at
	// all. The caller then owns fencing (for example with an external fence
	// source); Lease.Fence is zero.
	AllowNoFence bool
	// RenewEvery is the renewal period. Default TTL/3. Ignored when
	// NoAutoRenew is set.
	RenewEvery time.Duration
	// NoAutoRenew turns automatic renewal off: the lease ends when its TTL
	// runs out unless the holder calls Renew.
	NoAutoRenew bool
	// MaxHold caps the total time automatic renewal may keep the lease;
	// after it, renewal stops and the lease expires. Zero means no cap.
	MaxHold time.Duration
	// SafetyMargin is subtracted from the TTL for local validity, to allow
	// for clock drift between worker and authority. Default TTL/100 + 2ms.
	SafetyMargin time.Duration
	// FailOpen, for efficiency leases only, runs the work without a lease
	// when the authority is unavailable; the lease reports FailedOpen and
	// has fence zero. Correctness leases always fail closed.
	FailOpen bool
}

func (c *Client) resolve(o *LeaseOptions) LeaseOptions {
	var r LeaseOptions
	if o != nil {
		r = *o
	}
	d := c.opts.Defaults
	if r.TTL == 0 {
		r.TTL = d.TTL
	}
	if r.TTL == 0 {
		r.TTL = DefaultTTL
	}
	if r.MaxWait == 0 {
		r.MaxWait = d.MaxWait
	}
	if r.Purpose == Correctness {
		r.Purpose = d.Purpose
	}
	r.AllowRepeatableFence = r.AllowRepeatableFence || d.AllowRepeatableFence
	r.AllowNoFence = r.AllowNoFence || d.AllowNoFence
	r.NoAutoRenew = r.NoAutoRenew || d.NoAutoRenew
	r.FailOpen = r.FailOpen || d.FailOpen
	if r.RenewEvery == 0 {
		r.RenewEvery = d.RenewEvery
	}
	if r.RenewEvery == 0 {
		r.RenewEvery = r.TTL / 3
	}
	if r.MaxHold == 0 {
		r.MaxHold = d.MaxHold
	}
	if r.SafetyMargin == 0 {
		r.SafetyMargin = d.SafetyMargin
	}
	if r.SafetyMargin == 0 {
		r.SafetyMargin = r.TTL/100 + 2*time.Millisecond
	}
	return r
}

// check validates resolved options against the backend's guarantees.
func (c *Client) check(key string, o LeaseOptions) error {
	if err := ValidateKey(key); err != nil {
		return err
	}
	if err := c.validateTTL(o.TTL); err != nil {
		return err
	}
	if o.MaxWait < 0 && o.MaxWait != WaitForever {
		return fmt.Errorf("%w: MaxWait %v is negative (use 0 for no wait or WaitForever)", ErrInvalidTTL, o.MaxWait)
	}
	if o.RenewEvery < 0 || (!o.NoAutoRenew && o.RenewEvery >= o.TTL) {
		return fmt.Errorf("%w: RenewEvery %v must be positive and shorter than the TTL %v", ErrInvalidTTL, o.RenewEvery, o.TTL)
	}
	if o.SafetyMargin < 0 || o.SafetyMargin >= o.TTL {
		return fmt.Errorf("%w: SafetyMargin %v must be positive and shorter than the TTL %v", ErrInvalidTTL, o.SafetyMargin, o.TTL)
	}
	if o.MaxHold < 0 {
		return fmt.Errorf("%w: MaxHold %v is negative", ErrInvalidTTL, o.MaxHold)
	}
	if o.Purpose == Correctness {
		if o.FailOpen {
			return fmt.Errorf("FailOpen is only allowed for Efficiency leases: a correctness lease must fail closed")
		}
		g := c.drv.Guarantees()
		switch g.Fence {
		case FenceRepeatable:
			if !o.AllowRepeatableFence && !o.AllowNoFence {
				return fmt.Errorf("%w: this backend's fence is %s (%s); set AllowRepeatableFence to accept it or use Purpose Efficiency", ErrNoFence, g.Fence, g.Note)
			}
		case FenceNone:
			if !o.AllowNoFence {
				return fmt.Errorf("%w: this backend issues no fencing token (%s); use Purpose Efficiency, or set AllowNoFence and fence the resource yourself", ErrNoFence, g.Note)
			}
		}
	}
	return nil
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
	if b, ok := c.drv.(driver.TTLBounds); ok {
		dlo, dhi := b.TTLBounds()
		lo, hi = max(lo, dlo), min(hi, dhi)
	}
	if ttl < lo || ttl > hi {
		return fmt.Errorf("%w: %v is outside [%v, %v]", ErrInvalidTTL, ttl, lo, hi)
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
