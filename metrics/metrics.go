// Package metrics turns a fenced.Client's events into the observations an
// operator needs, independently of any metrics library. It names every
// series and classifies each event into a bounded set of label values. It
// keeps track of the leases a process holds, and calls a Recorder. Its two
// exporters live in their own packages, so that a program that imports only
// fenced compiles neither client_golang nor the OpenTelemetry SDK:
//
//   - metrics/fencedprom registers Prometheus collectors (client_golang) on
//     a prometheus.Registerer;
//   - metrics/fencedotel records OpenTelemetry instruments on a
//     metric.MeterProvider and spans (acquire, hold) on a
//     trace.TracerProvider.
//
// Both are driven by the same Hook function below, so they count the
// same things the same way. The series, after the source texts' "what to
// monitor" list (contention and wait time, renewal failures, critical
// section against the lease length, stale writes refused by the fence,
// owner churn):
//
//	fenced_acquire_attempts_total{store,key_group,result}   counter
//	fenced_acquire_wait_seconds{store,key_group}            histogram (granted acquisitions)
//	fenced_leases_held{store,key_group}                     gauge
//	fenced_lease_hold_seconds{store,key_group}              histogram
//	fenced_lease_hold_ttl_ratio{store,key_group}            histogram (hold time / TTL)
//	fenced_renewals_total{store,key_group,result}           counter
//	fenced_leases_lost_total{store,key_group,reason}        counter
//	fenced_lease_validity_remaining_seconds{store,key_group} gauge (least among held leases)
//	fenced_stale_writes_refused_total{store,key_group}      counter
//	fenced_owner_changes_total{store,key_group}             counter
//
// # Labels and cardinality
//
// store is the name given to Hook (one per client: the URL scheme, or a
// name of the caller's choosing such as "billing-pg"). key_group is a
// bounded projection of the key. It is never the key itself (keys such as
// invoice:inv_72 are unbounded) and never the owner. By default it is the
// key up to its first ':' (invoice:inv_72 → "invoice"); a key without ':' is
// its own group. A caller's KeyGroup function can replace it. The permits of
// a semaphore (fenced.Semaphore, keys encoders#0, encoders#1, …) are grouped
// by the semaphore's name, so its N slots are one group; likewise every key
// of a partition group (recipe.JoinPartitions: GROUP/p/<i>, GROUP/m/<P>/<id>,
// GROUP/w/bell) is grouped by the group's name, whatever P and the member
// IDs. The recipes mark their acquisitions (fenced.WithKeyGroup); renewals
// and ends of a lease take its acquisition's group. A key of the same form
// taken outside a recipe is grouped as any other key. Groups beyond
// MaxKeyGroups (default 100) distinct values are folded into OtherGroup, so
// a key scheme without colons (job-8f3a…) cannot explode the series count.
// result and reason take the fixed values listed below. Per store and key
// group that is at most 6 + 3 + 4 + 3 counter series, 3 histograms and 2
// gauges.
package metrics

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/fenced-dev/fenced"
)

// Series names in Prometheus form (base units, _total for counters). The
// OpenTelemetry exporter names its instruments in OpenTelemetry form (see
// Series.OTelName), which the standard OpenTelemetry-to-Prometheus
// translation turns back into these.
const (
	AcquireAttempts   = "fenced_acquire_attempts_total"
	AcquireWait       = "fenced_acquire_wait_seconds"
	LeasesHeld        = "fenced_leases_held"
	LeaseHold         = "fenced_lease_hold_seconds"
	LeaseHoldTTLRatio = "fenced_lease_hold_ttl_ratio"
	Renewals          = "fenced_renewals_total"
	LeasesLost        = "fenced_leases_lost_total"
	ValidityRemaining = "fenced_lease_validity_remaining_seconds"
	StaleWrites       = "fenced_stale_writes_refused_total"
	OwnerChanges      = "fenced_owner_changes_total"
)

// Names lists every series name above.
var Names = []string{AcquireAttempts, AcquireWait, LeasesHeld, LeaseHold, LeaseHoldTTLRatio, Renewals, LeasesLost, ValidityRemaining,
	StaleWrites, OwnerChanges}

// Label names.
const (
	LabelStore    = "store"
	LabelKeyGroup = "key_group"
	LabelResult   = "result"
	LabelReason   = "reason"
)

// Values of the result label of AcquireAttempts.
const (
	// ResultAcquired: the lease was granted.
	ResultAcquired = "acquired"
	// ResultFailedOpen: an efficiency lease with FailOpen ran without the
	// authority, which was unavailable.
	ResultFailedOpen = "failed_open"
	// ResultHeld: the key was held and the call did not wait (TryAcquire,
	// or MaxWait zero). Contention.
	ResultHeld = "held"
	// ResultTimeout: the key stayed held for the whole MaxWait, or the
	// caller's context deadline passed while waiting. Contention that hurt.
	ResultTimeout = "timeout"
	// ResultCanceled: the caller's context was cancelled.
	ResultCanceled = "canceled"
	// ResultError: anything else (the authority unavailable, a refused
	// option such as a missing fence, the client closed).
	ResultError = "error"
)

// AcquireResults lists every value of the result label of AcquireAttempts.
var AcquireResults = []string{ResultAcquired, ResultFailedOpen, ResultHeld, ResultTimeout, ResultCanceled, ResultError}

// Values of the result label of Renewals.
const (
	RenewOK      = "ok"
	RenewRefused = "refused" // the authority no longer had the grant
	RenewError   = "error"   // no answer, or an unknown outcome: retried
)

// RenewResults lists every value of the result label of Renewals.
var RenewResults = []string{RenewOK, RenewRefused, RenewError}

// Values of the reason label of LeasesLost.
const (
	// LostRefused: the authority said the grant was gone (renewal refused,
	// session ended, key deleted).
	LostRefused = "refused"
	// LostExpired: no renewal was confirmed before local validity ran out.
	LostExpired = "expired"
	// LostBroken: an admin broke the lease (fenced.ErrBroken; only where
	// the store keeps a break log, otherwise counted as refused).
	LostBroken = "broken"
	// LostClosed: the client was closed while the lease was held, which
	// released it and cancelled its work.
	LostClosed = "closed"
)

// LostReasons lists every value of the reason label of LeasesLost.
var LostReasons = []string{LostRefused, LostExpired, LostBroken, LostClosed}

// AcquireResult classifies the outcome of one acquisition (an
// EventAcquire).
func AcquireResult(e fenced.Event) string {
	switch {
	case e.Err == nil && e.Lease != nil && e.Lease.FailedOpen():
		return ResultFailedOpen
	case e.Err == nil:
		return ResultAcquired
	case errors.Is(e.Err, fenced.ErrHeld):
		if e.MaxWait > 0 || e.MaxWait == fenced.WaitForever {
			return ResultTimeout
		}
		return ResultHeld
	case errors.Is(e.Err, context.DeadlineExceeded):
		return ResultTimeout
	case errors.Is(e.Err, context.Canceled):
		return ResultCanceled
	}
	return ResultError
}

// RenewResult classifies the outcome of one renewal.
func RenewResult(err error) string {
	switch {
	case err == nil:
		return RenewOK
	case errors.Is(err, fenced.ErrNotHeld):
		return RenewRefused
	}
	return RenewError
}

// LostReason classifies why a lease ended without its holder releasing it.
func LostReason(cause error) string {
	switch {
	case errors.Is(cause, fenced.ErrBroken):
		return LostBroken
	case errors.Is(cause, fenced.ErrExpired):
		return LostExpired
	case errors.Is(cause, fenced.ErrClosed):
		return LostClosed
	}
	return LostRefused
}

// OtherGroup is the key group of keys whose group arrived after
// MaxKeyGroups others.
const OtherGroup = "_other"

// DefaultMaxKeyGroups bounds the distinct key groups of one exporter.
const DefaultMaxKeyGroups = 100

// DefaultKeyGroup returns key up to its first ':' ("invoice:inv_72" →
// "invoice"), or the whole key when it has none.
func DefaultKeyGroup(key string) string {
	if i := strings.IndexByte(key, ':'); i >= 0 {
		return key[:i]
	}
	return key
}

// Labels identify the series an observation belongs to.
type Labels struct {
	Store, KeyGroup string
}

// Recorder receives the observations of Hook. The exporters implement it;
// calls come from the client's goroutines, concurrently, and must not
// block.
type Recorder interface {
	// Init is called once per new (store, key group), before any other
	// call with those labels, so counters can start at zero (a counter
	// that appears with its first increment hides that increment from
	// rate() and increase()).
	Init(l Labels)
	AcquireAttempt(l Labels, result string)
	// AcquireWait is the time from the call to the grant.
	AcquireWait(l Labels, wait time.Duration)
	// Hold is called once per lease that ends (released, lost, or closed),
	// with its hold time and TTL.
	Hold(l Labels, held, ttl time.Duration)
	Renewal(l Labels, result string)
	Lost(l Labels, reason string)
	StaleWrite(l Labels)
	OwnerChange(l Labels)
}

// Options configure Hook. The zero value gives the defaults.
type Options struct {
	// KeyGroup maps a key to its bounded group. Default DefaultKeyGroup.
	// It must return few distinct values; MaxKeyGroups caps them anyway.
	KeyGroup func(key string) string
	// MaxKeyGroups caps the distinct groups; later ones are reported as
	// OtherGroup. Default DefaultMaxKeyGroups.
	MaxKeyGroups int
}

// Groups maps keys to their bounded key groups: KeyGroup's value, or
// OtherGroup once MaxKeyGroups other groups have been seen. Safe for
// concurrent use.
type Groups struct {
	keyGroup  func(string) string
	maxGroups int

	mu   sync.Mutex
	seen map[string]struct{}
}

// NewGroups returns the groups of opts (nil for the defaults).
func NewGroups(opts *Options) *Groups {
	g := &Groups{keyGroup: DefaultKeyGroup, maxGroups: DefaultMaxKeyGroups, seen: map[string]struct{}{}}
	if opts != nil {
		if opts.KeyGroup != nil {
			g.keyGroup = opts.KeyGroup
		}
		if opts.MaxKeyGroups > 0 {
			g.maxGroups = opts.MaxKeyGroups
		}
	}
	return g
}

// Of returns the key group of key.
func (g *Groups) Of(key string) string {
	group := g.keyGroup(key)
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.seen[group]; !ok {
		if len(g.seen) >= g.maxGroups {
			return OtherGroup
		}
		g.seen[group] = struct{}{}
	}
	return group
}

// Tracker follows the leases held through the hooks it built, for the
// gauges (leases held, least remaining validity) that exporters read when
// they are scraped. Safe for concurrent use.
type Tracker struct {
	*Groups

	mu      sync.Mutex
	seen    map[Labels]struct{}
	held    map[*fenced.Lease]Labels
	permits map[string]string // marked key (a permit, a partition) → its group's name
}

// maxPermitKeys bounds the permit keys a Tracker remembers; permits seen
// beyond it are grouped by their key as any other.
const maxPermitKeys = 4096

// permit records that key is a permit of the semaphore name.
func (t *Tracker) permit(key, name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.permits[key]; ok || len(t.permits) < maxPermitKeys {
		t.permits[key] = name
	}
}

// groupKey returns what key is grouped by: the name of the semaphore key
// is a permit of, or key itself.
func (t *Tracker) groupKey(key string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if name, ok := t.permits[key]; ok {
		return name
	}
	return key
}

// NewTracker returns a Tracker with opts (nil for the defaults).
func NewTracker(opts *Options) *Tracker {
	return &Tracker{Groups: NewGroups(opts), seen: map[Labels]struct{}{}, held: map[*fenced.Lease]Labels{}, permits: map[string]string{}}
}

// labels returns the labels of key in store, and whether they are new.
func (t *Tracker) labels(store, key string) (Labels, bool) {
	l := Labels{Store: store, KeyGroup: t.Of(key)}
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.seen[l]; ok {
		return l, false
	}
	t.seen[l] = struct{}{}
	return l, true
}

// GroupOf returns the key group of e's key as Hook labels it: the group
// its acquisition was marked with (fenced.WithKeyGroup: a semaphore's
// permits, a partition group's keys), else the key's own.
func (t *Tracker) GroupOf(e fenced.Event) string {
	if name, ok := fenced.KeyGroup(e.Context); ok {
		return t.Of(name)
	}
	return t.Of(t.groupKey(e.Key))
}

// heldLabels returns the labels l was granted under, while it is held:
// those of its acquisition, whatever the permit keys remembered.
func (t *Tracker) heldLabels(l *fenced.Lease) (Labels, bool) {
	if l == nil {
		return Labels{}, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	lb, ok := t.held[l]
	return lb, ok
}

func (t *Tracker) add(l *fenced.Lease, lb Labels) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.held[l] = lb
}

// remove forgets l and reports whether it was held: a lease that was lost
// and then released ends only once.
func (t *Tracker) remove(l *fenced.Lease) (Labels, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	lb, ok := t.held[l]
	delete(t.held, l)
	return lb, ok
}

// Gauge is the state of one (store, key group) at a moment.
type Gauge struct {
	Labels
	// Held counts the leases held through the tracked hooks.
	Held int
	// MinRemaining is the least local validity left among them (see
	// fenced.Lease.Remaining); meaningless when Held is zero.
	MinRemaining time.Duration
}

// Gauges returns the state of every (store, key group) seen so far, with
// Held zero for those holding nothing now.
func (t *Tracker) Gauges() []Gauge {
	t.mu.Lock()
	leases := make(map[*fenced.Lease]Labels, len(t.held))
	for l, lb := range t.held {
		leases[l] = lb
	}
	out := make(map[Labels]*Gauge, len(t.seen))
	for lb := range t.seen {
		out[lb] = &Gauge{Labels: lb}
	}
	t.mu.Unlock()
	for l, lb := range leases {
		g := out[lb]
		left := l.Remaining()
		if g.Held == 0 || left < g.MinRemaining {
			g.MinRemaining = left
		}
		g.Held++
	}
	gs := make([]Gauge, 0, len(out))
	for _, g := range out {
		gs = append(gs, *g)
	}
	return gs
}

// Hook returns a hook that reports the events of a client on store to r and
// keeps t up to date. Give each client its own store name; one Tracker and
// Recorder may serve several clients. Guards in package fence report stale
// writes to the hook of the client that issued the token. So a guard needs
// no hook of its own.
func Hook(store string, t *Tracker, r Recorder) func(fenced.Event) {
	// labels returns the labels of what key is grouped by (gk: the key,
	// or the group an acquisition was marked with).
	labels := func(gk string) Labels {
		l, isNew := t.labels(store, gk)
		if isNew {
			r.Init(l)
		}
		return l
	}
	end := func(l *fenced.Lease, held time.Duration) (Labels, bool) {
		if l == nil {
			return Labels{}, false
		}
		lb, ok := t.remove(l)
		if ok {
			r.Hold(lb, held, l.Options().TTL)
		}
		return lb, ok
	}
	return func(e fenced.Event) {
		switch e.Kind {
		case fenced.EventAcquire:
			gk, marked := fenced.KeyGroup(e.Context)
			if marked {
				t.permit(e.Key, gk)
			} else {
				gk = t.groupKey(e.Key)
			}
			l := labels(gk)
			result := AcquireResult(e)
			r.AcquireAttempt(l, result)
			if result != ResultAcquired {
				return
			}
			r.AcquireWait(l, e.Duration)
			if e.Contended {
				r.OwnerChange(l)
			}
			if e.Lease != nil {
				t.add(e.Lease, l)
			}
		case fenced.EventRenew:
			l, ok := t.heldLabels(e.Lease)
			if !ok {
				l = labels(t.groupKey(e.Key))
			}
			r.Renewal(l, RenewResult(e.Err))
		case fenced.EventLost:
			if l, ok := end(e.Lease, e.Duration); ok {
				r.Lost(l, LostReason(e.Err))
			}
		case fenced.EventRelease:
			if l, ok := end(e.Lease, e.Duration); ok && errors.Is(e.Lease.Err(), fenced.ErrClosed) {
				r.Lost(l, LostClosed)
			}
		case fenced.EventStaleWrite:
			r.StaleWrite(labels(t.groupKey(e.Key)))
		}
	}
}

// Join returns a hook that calls each of hs (nil ones skipped) in order.
// Use it for a client reported to several exporters, or to an exporter and
// the caller's own logging.
func Join(hs ...func(fenced.Event)) func(fenced.Event) {
	var j []func(fenced.Event)
	for _, h := range hs {
		if h != nil {
			j = append(j, h)
		}
	}
	switch len(j) {
	case 0:
		return nil
	case 1:
		return j[0]
	}
	return func(e fenced.Event) {
		for _, h := range j {
			h(e)
		}
	}
}

// Series of a partition group member (recipe.Partitions), in Prometheus
// form, labelled by LabelGroup only: fencedprom.PartitionsCollector exports
// them all, fencedotel.Telemetry.ObservePartitions the first eight.
const (
	PartitionsMembers         = "fenced_partitions_members"
	PartitionsOwned           = "fenced_partitions_owned"
	PartitionsTarget          = "fenced_partitions_target"
	PartitionsUnowned         = "fenced_partitions_unowned"
	PartitionsMoves           = "fenced_partitions_moves_total"
	PartitionsTimeToStable    = "fenced_partitions_time_to_stable_seconds"
	PartitionsHandoffDuration = "fenced_partitions_handoff_duration_seconds"
	PartitionsHandoffOverruns = "fenced_partitions_handoff_overruns_total"
	PartitionsRebalances      = "fenced_partitions_rebalances_total"
	PartitionsAcquired        = "fenced_partitions_acquired_total"
	PartitionsHandoffs        = "fenced_partitions_handoffs_total"
	PartitionsHandoffTime     = "fenced_partitions_handoff_seconds_total"
	PartitionsUnownedTime     = "fenced_partitions_unowned_seconds_total"
)

// PartitionsNames lists the partition group series above, those both
// exporters have first.
var PartitionsNames = []string{PartitionsMembers, PartitionsOwned, PartitionsTarget, PartitionsUnowned, PartitionsMoves,
	PartitionsTimeToStable, PartitionsHandoffDuration, PartitionsHandoffOverruns, PartitionsRebalances, PartitionsAcquired,
	PartitionsHandoffs, PartitionsHandoffTime, PartitionsUnownedTime}

// LabelGroup is the one label of the partition group series: the group's
// name as the program gives it, never a member ID.
const LabelGroup = "group"
