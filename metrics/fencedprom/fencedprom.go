// Package fencedprom exports a fenced.Client's metrics to Prometheus with
// client_golang: the series of package metrics, registered on the caller's
// prometheus.Registerer.
//
//	m, err := fencedprom.New(prometheus.DefaultRegisterer, nil)
//	...
//	client, err := fenced.Open(ctx, "postgres://app@db/app", &fenced.Options{Hook: m.Hook("postgres")})
//
// Guards in package fence report stale writes to the hook of the client
// whose lease issued the token, so fenced_stale_writes_refused_total counts
// them without further wiring. See package metrics for the series, their
// labels and their cardinality, and docs/metrics.md for alerts.
//
// It lives in its own package so that programs importing only fenced do
// not compile client_golang.
package fencedprom

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/metrics"
)

// Default histogram buckets.
var (
	// DefaultWaitBuckets span 1ms to about 4 minutes (×4 per bucket).
	DefaultWaitBuckets = prometheus.ExponentialBuckets(0.001, 4, 10)
	// DefaultHoldBuckets span 10ms to about 12 hours (×4 per bucket).
	DefaultHoldBuckets = prometheus.ExponentialBuckets(0.01, 4, 12)
	// DefaultRatioBuckets: below 1 the work fitted in one TTL; above 1
	// renewals carried it.
	DefaultRatioBuckets = []float64{0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 5, 10, 100}
)

// Options configure New. The zero value (or nil) gives the defaults.
type Options struct {
	// Groups bounds the key_group label; see metrics.Options.
	Groups metrics.Options
	// WaitBuckets, HoldBuckets and RatioBuckets override the histograms'
	// buckets (seconds, seconds, ratio).
	WaitBuckets, HoldBuckets, RatioBuckets []float64
}

// Metrics is a prometheus.Collector of fenced's series. Give its Hook to
// each client; one Metrics serves any number of clients and stores.
type Metrics struct {
	tracker *metrics.Tracker

	attempts, renewals, lost *prometheus.CounterVec
	stale, ownerChanges      *prometheus.CounterVec
	wait, hold, ratio        *prometheus.HistogramVec
	heldDesc, validityDesc   *prometheus.Desc
}

var _ prometheus.Collector = (*Metrics)(nil)

// New returns the collector and registers it on reg (nil: do not register,
// for callers that register it themselves). It fails when reg already has
// fenced's series.
func New(reg prometheus.Registerer, opts *Options) (*Metrics, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.WaitBuckets == nil {
		o.WaitBuckets = DefaultWaitBuckets
	}
	if o.HoldBuckets == nil {
		o.HoldBuckets = DefaultHoldBuckets
	}
	if o.RatioBuckets == nil {
		o.RatioBuckets = DefaultRatioBuckets
	}
	base := []string{metrics.LabelStore, metrics.LabelKeyGroup}
	with := func(l string) []string { return append(append([]string(nil), base...), l) }
	m := &Metrics{
		tracker: metrics.NewTracker(&o.Groups),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: metrics.AcquireAttempts,
			Help: "Acquisitions by outcome: acquired, failed_open, held (refused at once), timeout (the wait ran out), canceled, error."},
			with(metrics.LabelResult)),
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: metrics.Renewals,
			Help: "Renewals by outcome: ok, refused (the authority no longer had the grant), " +
				"error (retried until local validity ran out)."}, with(metrics.LabelResult)),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{Name: metrics.LeasesLost,
			Help: "Leases that ended without their holder releasing them, by reason: refused, expired, broken, closed."},
			with(metrics.LabelReason)),
		stale: prometheus.NewCounterVec(prometheus.CounterOpts{Name: metrics.StaleWrites,
			Help: "Writes refused by a fence guard because a newer holder had written: each one is a paused or partitioned holder caught."},
			base),
		ownerChanges: prometheus.NewCounterVec(prometheus.CounterOpts{Name: metrics.OwnerChanges,
			Help: "Grants that took a key over from another holder (the key was found held, then granted): hand-overs, the key's churn."},
			base),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: metrics.AcquireWait,
			Help: "Time from the acquire call to the grant, for granted acquisitions.", Buckets: o.WaitBuckets}, base),
		hold: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: metrics.LeaseHold,
			Help: "How long leases were held, from the acquire request to their release or loss.", Buckets: o.HoldBuckets}, base),
		ratio: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: metrics.LeaseHoldTTLRatio,
			Help: "Hold time over the lease's TTL: the critical section against the lease length.", Buckets: o.RatioBuckets}, base),
		heldDesc: prometheus.NewDesc(metrics.LeasesHeld,
			"Leases held now.", base, nil),
		validityDesc: prometheus.NewDesc(metrics.ValidityRemaining,
			"The least local validity left among the leases held now: how close the next loss is if renewals stop. "+
				"Absent when none is held.", base, nil),
	}
	if reg != nil {
		if err := reg.Register(m); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Hook returns the hook of a client on store (a short name such as the
// URL scheme; it becomes the store label).
func (m *Metrics) Hook(store string) func(fenced.Event) {
	return metrics.Hook(store, m.tracker, recorder{m})
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
	ch <- m.heldDesc
	ch <- m.validityDesc
}

// Collect implements prometheus.Collector. The gauges are computed from
// the leases held at the moment of the scrape.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
	for _, g := range m.tracker.Gauges() {
		ch <- prometheus.MustNewConstMetric(m.heldDesc, prometheus.GaugeValue, float64(g.Held), g.Store, g.KeyGroup)
		if g.Held > 0 {
			ch <- prometheus.MustNewConstMetric(m.validityDesc, prometheus.GaugeValue, g.MinRemaining.Seconds(), g.Store, g.KeyGroup)
		}
	}
}

func (m *Metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.attempts, m.renewals, m.lost, m.stale, m.ownerChanges, m.wait, m.hold, m.ratio}
}

// recorder implements metrics.Recorder on m's vectors.
type recorder struct{ m *Metrics }

func (r recorder) Init(l metrics.Labels) {
	for _, v := range metrics.AcquireResults {
		r.m.attempts.WithLabelValues(l.Store, l.KeyGroup, v)
	}
	for _, v := range metrics.RenewResults {
		r.m.renewals.WithLabelValues(l.Store, l.KeyGroup, v)
	}
	for _, v := range metrics.LostReasons {
		r.m.lost.WithLabelValues(l.Store, l.KeyGroup, v)
	}
	r.m.stale.WithLabelValues(l.Store, l.KeyGroup)
	r.m.ownerChanges.WithLabelValues(l.Store, l.KeyGroup)
}

func (r recorder) AcquireAttempt(l metrics.Labels, result string) {
	r.m.attempts.WithLabelValues(l.Store, l.KeyGroup, result).Inc()
}

func (r recorder) AcquireWait(l metrics.Labels, wait time.Duration) {
	r.m.wait.WithLabelValues(l.Store, l.KeyGroup).Observe(wait.Seconds())
}

func (r recorder) Hold(l metrics.Labels, held, ttl time.Duration) {
	r.m.hold.WithLabelValues(l.Store, l.KeyGroup).Observe(held.Seconds())
	if ttl > 0 {
		r.m.ratio.WithLabelValues(l.Store, l.KeyGroup).Observe(held.Seconds() / ttl.Seconds())
	}
}

func (r recorder) Renewal(l metrics.Labels, result string) {
	r.m.renewals.WithLabelValues(l.Store, l.KeyGroup, result).Inc()
}

func (r recorder) Lost(l metrics.Labels, reason string) {
	r.m.lost.WithLabelValues(l.Store, l.KeyGroup, reason).Inc()
}

func (r recorder) StaleWrite(l metrics.Labels) {
	r.m.stale.WithLabelValues(l.Store, l.KeyGroup).Inc()
}

func (r recorder) OwnerChange(l metrics.Labels) {
	r.m.ownerChanges.WithLabelValues(l.Store, l.KeyGroup).Inc()
}
