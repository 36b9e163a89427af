// Package leaseplan computes the lease trade-off that `fenced plan` prints
// and the dashboard of `fenced serve` draws: for a TTL and a renewal
// interval on a given backend, the longest freeze a holder absorbs, the
// stale window of a longer freeze (when only the resource's fence protects
// it), the recovery time after a crash, and the renewal traffic; and, for a
// measured worst pause, the TTL to use.
//
// The model is the worst case of the source texts: the holder freezes just
// as a renewal falls due, RenewEvery after its last renewal was sent.
//
//   - The holder itself trusts the lease for TTL − SafetyMargin after that
//     send (local validity). A freeze shorter than
//     TTL − SafetyMargin − RenewEvery is absorbed: on waking it renews and
//     nothing happened.
//   - The authority keeps the grant at least AuthorityTTL after the send
//     (the TTL as the backend rounds it up), so nobody else can hold the
//     key before RegrantAfter = AuthorityTTL − RenewEvery into the freeze.
//     A freeze between the two loses the lease safely: the holder wakes,
//     sees its validity gone, and nobody else had the key.
//   - A longer freeze P leaves a stale window of P − RegrantAfter: another
//     worker may hold the key while the frozen one still acts on its old
//     belief, and whatever it had in flight lands after the new holder's
//     writes. Only the fence, checked by the resource, refuses those.
//   - After a crash, the key is free again between AuthorityTTL −
//     RenewEvery (crash just before a renewal) and AuthorityTTL + Sweep
//     (crash just after one; Sweep is how late the authority may notice
//     an expiry).
//
// How backends round TTLs comes from their packages (see Authority).
package leaseplan

import (
	"errors"
	"fmt"
	"time"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/core/rootaccess"
	"github.com/fenced-dev/fenced/internal/core/ttlrule"
)

// Authority describes how a backend turns a requested TTL into the time it
// keeps an unrenewed grant. It is the Expiry its package registers with its
// URL opener (fenced.Register, read with rootaccess.ExpiryOf). The rounding
// rules live with each backend; this package only figures with them.
type Authority struct {
	// Scheme is the store URL scheme.
	Scheme string
	driver.Expiry
}

// WithBounds narrows a's TTL bounds to what a live driver reports
// (driver.Capabilities), such as a ZooKeeper ensemble's maxSessionTimeout.
func (a Authority) WithBounds(lo, hi time.Duration) Authority {
	a.MinTTL, a.MaxTTL = max(a.MinTTL, lo), min(a.MaxTTL, hi)
	return a
}

// authority returns the Authority of scheme for e, with the portable TTL
// bounds where e names none, named after the scheme where e has no name (a
// backend registered with a zero Expiry).
func authority(scheme string, e driver.Expiry) Authority {
	if e.Name == "" {
		e.Name = scheme
	}
	if e.MinTTL == 0 {
		e.MinTTL = ttlrule.Min
	}
	if e.MaxTTL == 0 {
		e.MaxTTL = ttlrule.Max
	}
	return Authority{Scheme: scheme, Expiry: e}
}

// Authorities returns the registered backends by URL scheme: those whose
// packages the program imports.
func Authorities() map[string]Authority {
	out := map[string]Authority{}
	for _, scheme := range rootaccess.Schemes() {
		if e, ok := rootaccess.ExpiryOf(scheme); ok {
			out[scheme] = authority(scheme, e)
		}
	}
	return out
}

// ForScheme returns the Authority of a URL scheme; a scheme that registered
// none gets an exact authority named after it.
func ForScheme(scheme string) Authority {
	if e, ok := rootaccess.ExpiryOf(scheme); ok {
		return authority(scheme, e)
	}
	return authority(scheme, driver.Expiry{Name: scheme, Note: "unknown backend: assumed to expire grants exactly at the TTL"})
}

// Input is what to plan. Zero RenewEvery and SafetyMargin take the client's
// defaults (TTL/3, ttlrule.DefaultSafetyMargin). MaxPause, when set, is the
// longest pause the holder is known to suffer (GC, VM migration, swap).
type Input struct {
	TTL, RenewEvery, SafetyMargin, MaxPause time.Duration
	Authority                               Authority
}

// Plan is the trade-off of one Input.
type Plan struct {
	Input
	// AuthorityTTL is how long the authority keeps an unrenewed grant.
	AuthorityTTL time.Duration
	// LocalValidity is TTL − SafetyMargin: how long the holder trusts a
	// grant after sending the request that made or renewed it.
	LocalValidity time.Duration
	// FreezeAbsorbed is the longest freeze, starting as a renewal falls
	// due, after which the holder still holds its lease.
	FreezeAbsorbed time.Duration
	// RegrantAfter is how far into such a freeze another worker may be
	// granted the key.
	RegrantAfter time.Duration
	// StaleWindow is, for a freeze of MaxPause, how long another worker
	// may hold the key while the frozen one still believes it does. Zero
	// when MaxPause is not longer than RegrantAfter.
	StaleWindow time.Duration
	// RecoveryBest and RecoveryWorst bound how long after a crash of the
	// holder the key is free again.
	RecoveryBest, RecoveryWorst time.Duration
	// RenewalsPerSecond is the renewal traffic of one lease.
	RenewalsPerSecond float64
	// FailedRenewalsTolerated is how many scheduled renewals in a row may
	// fail (time out, find the authority unreachable) before the lease is
	// lost. The client retries sooner after a failure, so this is the
	// floor.
	FailedRenewalsTolerated int
	// RecommendedTTL is, when MaxPause is set and not absorbed, the
	// shortest TTL (renewed at a third) that absorbs it, rounded up for
	// the backend; zero otherwise.
	RecommendedTTL time.Duration
	// Advice says what the numbers mean, most important first.
	Advice []string
}

// ErrInput means an Input cannot be planned; the message names the field.
var ErrInput = errors.New("invalid plan input")

// Compute plans in, or explains why it cannot.
func Compute(in Input) (Plan, error) {
	a := in.Authority
	if a.Scheme == "" {
		return Plan{}, fmt.Errorf("%w: no backend", ErrInput)
	}
	if in.TTL < a.MinTTL || in.TTL > a.MaxTTL {
		return Plan{}, fmt.Errorf("%w: TTL %v is outside %s's bounds [%v, %v]", ErrInput, in.TTL, a.Name, a.MinTTL, a.MaxTTL)
	}
	if in.SafetyMargin == 0 {
		in.SafetyMargin = ttlrule.DefaultSafetyMargin(in.TTL)
	}
	if in.SafetyMargin < 0 || in.SafetyMargin >= in.TTL {
		return Plan{}, fmt.Errorf("%w: safety margin %v must be positive and shorter than the TTL %v", ErrInput, in.SafetyMargin, in.TTL)
	}
	p := Plan{Input: in, LocalValidity: in.TTL - in.SafetyMargin}
	if p.RenewEvery == 0 {
		p.RenewEvery = in.TTL / 3
	}
	if p.RenewEvery < 0 || p.RenewEvery >= p.LocalValidity {
		return Plan{}, fmt.Errorf("%w: renewal interval %v must be positive and shorter than the local validity %v "+
			"(TTL %v minus safety margin %v)", ErrInput, p.RenewEvery, p.LocalValidity, in.TTL, in.SafetyMargin)
	}
	if in.MaxPause < 0 {
		return Plan{}, fmt.Errorf("%w: max pause %v is negative", ErrInput, in.MaxPause)
	}
	p.AuthorityTTL = a.KeepsFor(in.TTL)
	p.FreezeAbsorbed = p.LocalValidity - p.RenewEvery
	p.RegrantAfter = p.AuthorityTTL - p.RenewEvery
	p.StaleWindow = max(0, in.MaxPause-p.RegrantAfter)
	p.RecoveryBest = p.AuthorityTTL - p.RenewEvery
	p.RecoveryWorst = a.Outlives(in.TTL)
	p.RenewalsPerSecond = float64(time.Second) / float64(p.RenewEvery)
	// Renewals scheduled at k·RenewEvery that are sent before local
	// validity ends; all but one of them may fail.
	p.FailedRenewalsTolerated = max(0, int((p.LocalValidity-1)/p.RenewEvery)-1)
	if in.MaxPause > p.FreezeAbsorbed {
		p.RecommendedTTL = recommend(in.MaxPause, a)
	}
	p.Advice = advise(p)
	return p, nil
}

// recommend returns the shortest TTL that absorbs a freeze of pause when
// renewed at a third of it with the default margin, rounded up to a whole
// second (to 100ms below 10s) and to the backend's granularity.
func recommend(pause time.Duration, a Authority) time.Duration {
	absorbs := func(ttl time.Duration) bool {
		return ttl-ttlrule.DefaultSafetyMargin(ttl)-ttl/3 > pause
	}
	// TTL·(1 − 1/100 − 1/3) − 2ms > pause.
	ttl := time.Duration(float64(pause+2*time.Millisecond) * 300 / 197)
	step := 100 * time.Millisecond
	if ttl >= 10*time.Second {
		step = time.Second
	}
	step = max(step, a.Granularity)
	ttl = (ttl + step - 1) / step * step
	for !absorbs(ttl) {
		ttl += step
	}
	return ttl
}

func advise(p Plan) []string {
	var out []string
	a := p.Authority
	if p.AuthorityTTL > p.TTL {
		out = append(out, fmt.Sprintf("%s keeps an unrenewed grant %v, not the TTL %v: %s.", a.Name, p.AuthorityTTL, p.TTL, a.Note))
	}
	switch {
	case p.MaxPause == 0:
		out = append(out,
			fmt.Sprintf("A freeze up to %v is absorbed; a longer one loses the lease, and beyond %v another worker may hold the key "+
				"while the frozen one still acts: only the fence protects the resource then. Measure your worst pause and pass it as "+
				"--max-pause.", round(p.FreezeAbsorbed), round(p.RegrantAfter)))
	case p.RecommendedTTL == 0:
		out = append(out, fmt.Sprintf("OK: a %v pause is absorbed with %v to spare.", p.MaxPause, round(p.FreezeAbsorbed-p.MaxPause)))
	default:
		if p.StaleWindow > 0 {
			out = append(out,
				fmt.Sprintf("A %v pause is NOT absorbed: for %v another worker may hold the key while the frozen one still acts. "+
					"Only the fence refuses its late writes.", p.MaxPause, round(p.StaleWindow)))
		} else {
			out = append(out,
				fmt.Sprintf("A %v pause is NOT absorbed: the holder loses its lease (safely: nobody else can have the key yet) "+
					"and its work is cancelled.", p.MaxPause))
		}
		out = append(out,
			fmt.Sprintf("Recommendation: TTL %v (renew every %v) absorbs it, at the price of recovery after a crash of up to %v instead "+
				"of %v. Raise the TTL only for pauses you measured: if the pauses come from a stuck dependency or a hot key, "+
				"a longer TTL only makes the incident longer; a refused stale write is the fence doing its job.",
				p.RecommendedTTL, round(p.RecommendedTTL/3), round(a.Outlives(p.RecommendedTTL)), round(p.RecoveryWorst)))
	}
	if p.FailedRenewalsTolerated == 0 {
		out = append(out,
			fmt.Sprintf("Renewing every %v of a %v TTL tolerates no failed renewal: one slow round trip loses the lease. "+
				"Renew at about a third of the TTL (%v).", p.RenewEvery, p.TTL, round(p.TTL/3)))
	}
	if p.RenewEvery < p.TTL/10 {
		out = append(out,
			fmt.Sprintf("Renewing every %v costs %.1f requests/s per lease; a third of the TTL (%v) "+
				"tolerates a failed renewal at a fraction of the traffic.", p.RenewEvery, p.RenewalsPerSecond, round(p.TTL/3)))
	}
	return out
}

// round shortens a duration for advice text.
func round(d time.Duration) time.Duration {
	switch {
	case d >= 10*time.Second:
		return d.Round(100 * time.Millisecond)
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	}
	return d.Round(time.Millisecond)
}

// JSON is the machine-readable form of a Plan (durations in milliseconds),
// shared by `fenced plan -o json` and the HTTP API of `fenced serve`.
type JSON struct {
	Store                   string   `json:"store"`
	Backend                 string   `json:"backend"`
	BackendNote             string   `json:"backend_note"`
	TTLMS                   int64    `json:"ttl_ms"`
	RenewEveryMS            int64    `json:"renew_every_ms"`
	SafetyMarginMS          int64    `json:"safety_margin_ms"`
	MaxPauseMS              int64    `json:"max_pause_ms"`
	AuthorityTTLMS          int64    `json:"authority_ttl_ms"`
	LocalValidityMS         int64    `json:"local_validity_ms"`
	FreezeAbsorbedMS        int64    `json:"freeze_absorbed_ms"`
	RegrantAfterMS          int64    `json:"regrant_after_ms"`
	StaleWindowMS           int64    `json:"stale_window_ms"`
	RecoveryBestMS          int64    `json:"recovery_best_ms"`
	RecoveryWorstMS         int64    `json:"recovery_worst_ms"`
	RenewalsPerSecond       float64  `json:"renewals_per_second"`
	FailedRenewalsTolerated int      `json:"failed_renewals_tolerated"`
	RecommendedTTLMS        int64    `json:"recommended_ttl_ms,omitempty"`
	MinTTLMS                int64    `json:"min_ttl_ms"`
	MaxTTLMS                int64    `json:"max_ttl_ms"`
	Advice                  []string `json:"advice"`
}

// JSON returns p's machine-readable form.
func (p Plan) JSON() JSON {
	ms := func(d time.Duration) int64 { return d.Milliseconds() }
	return JSON{
		Store: p.Authority.Scheme, Backend: p.Authority.Name, BackendNote: p.Authority.Note,
		TTLMS: ms(p.TTL), RenewEveryMS: ms(p.RenewEvery), SafetyMarginMS: ms(p.SafetyMargin), MaxPauseMS: ms(p.MaxPause),
		AuthorityTTLMS: ms(p.AuthorityTTL), LocalValidityMS: ms(p.LocalValidity), FreezeAbsorbedMS: ms(p.FreezeAbsorbed),
		RegrantAfterMS: ms(p.RegrantAfter), StaleWindowMS: ms(p.StaleWindow),
		RecoveryBestMS: ms(p.RecoveryBest), RecoveryWorstMS: ms(p.RecoveryWorst),
		RenewalsPerSecond: p.RenewalsPerSecond, FailedRenewalsTolerated: p.FailedRenewalsTolerated,
		RecommendedTTLMS: ms(p.RecommendedTTL), MinTTLMS: ms(p.Authority.MinTTL), MaxTTLMS: ms(p.Authority.MaxTTL),
		Advice: p.Advice,
	}
}
