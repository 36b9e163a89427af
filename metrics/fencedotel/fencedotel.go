// Package fencedotel exports a fenced.Client's metrics and traces through
// OpenTelemetry: the series of package metrics as instruments of a
// metric.MeterProvider, and spans on a trace.TracerProvider:
//
//   - "fenced.acquire", one per Acquire, TryAcquire or Do call, from the
//     call to its outcome (so its length is the wait), parented to the span
//     in the caller's context, with the outcome, attempts and fence;
//   - "fenced.hold", from the grant to the release or loss, parented like
//     the acquire span and linked to it, with an event per renewal that did
//     not succeed and a "lost" event (and an error status) when the lease
//     was lost.
//
// Give each client the hook of its store:
//
//	tel, err := fencedotel.New(meterProvider, tracerProvider, nil)
//	...
//	client, err := fenced.Open(ctx, url, &fenced.Options{Hook: tel.Hook("postgres")})
//
// Instrument names follow OpenTelemetry's conventions (dotted, with UCUM
// units: "s", "1", "{lease}"); the standard translation to Prometheus
// (the OpenTelemetry Prometheus exporter, or an OTLP receiver that
// translates) turns them into exactly the names fencedprom registers, such
// as fenced_acquire_wait_seconds and fenced_leases_lost_total. Attributes
// are the labels of package metrics (store, key_group, result, reason),
// with the same bounds. Spans carry the key group, not the key, unless
// Options.RecordKey is set.
//
// It lives in its own package so that programs importing only fenced do
// not compile the OpenTelemetry API.
package fencedotel

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/metrics"
)

// ScopeName is the instrumentation scope of the meter and the tracer.
const ScopeName = "github.com/fenced-dev/fenced/metrics/fencedotel"

// Instrument names (OpenTelemetry form) of the series of package metrics.
const (
	AcquireAttempts   = "fenced.acquire.attempts"
	AcquireWait       = "fenced.acquire.wait"
	LeasesHeld        = "fenced.leases.held"
	LeaseHold         = "fenced.lease.hold"
	LeaseHoldTTLRatio = "fenced.lease.hold_ttl_ratio"
	Renewals          = "fenced.renewals"
	LeasesLost        = "fenced.leases.lost"
	ValidityRemaining = "fenced.lease.validity_remaining"
	StaleWrites       = "fenced.stale_writes.refused"
	OwnerChanges      = "fenced.owner_changes"
)

// Span names.
const (
	SpanAcquire = "fenced.acquire"
	SpanHold    = "fenced.hold"
)

// Span attribute keys (besides the metric labels).
const (
	AttrKey      = attribute.Key("fenced.key")
	AttrKeyGroup = attribute.Key("fenced.key_group")
	AttrStore    = attribute.Key("fenced.store")
	AttrFence    = attribute.Key("fenced.fence")
	AttrResult   = attribute.Key("fenced.result")
	AttrAttempts = attribute.Key("fenced.attempts")
	AttrTTL      = attribute.Key("fenced.ttl_seconds")
	AttrReason   = attribute.Key("fenced.reason")
)

// Options configure New. The zero value (or nil) gives the defaults.
type Options struct {
	// Groups bounds the key_group attribute; see metrics.Options.
	Groups metrics.Options
	// WaitBuckets, HoldBuckets and RatioBuckets set the histograms'
	// explicit bucket boundaries (seconds, seconds, ratio); nil leaves the
	// SDK's defaults (or its views) in charge.
	WaitBuckets, HoldBuckets, RatioBuckets []float64
	// RecordKey adds the lease key itself to spans (fenced.key). Keys can
	// name customers or documents; leave it off unless traces may hold
	// them.
	RecordKey bool
}

// Telemetry records fenced's metrics and spans. Give its Hook to each
// client; one Telemetry serves any number of clients and stores.
type Telemetry struct {
	opts    Options
	tracker *metrics.Tracker
	tracer  trace.Tracer // nil without a TracerProvider

	attempts, renewals, lost, stale, ownerChanges metric.Int64Counter
	wait, hold, ratio                             metric.Float64Histogram

	parts *partitionsInstruments // nil without a MeterProvider

	mu    sync.Mutex
	holds map[*fenced.Lease]trace.Span
}

// New creates the instruments on mp and the tracer on tp. Either may be
// nil to record only traces or only metrics.
func New(mp metric.MeterProvider, tp trace.TracerProvider, opts *Options) (*Telemetry, error) {
	t := &Telemetry{holds: map[*fenced.Lease]trace.Span{}}
	if opts != nil {
		t.opts = *opts
	}
	t.tracker = metrics.NewTracker(&t.opts.Groups)
	if tp != nil {
		t.tracer = tp.Tracer(ScopeName)
	}
	if mp == nil {
		return t, nil
	}
	m := mp.Meter(ScopeName)
	var errs []error
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	histogram := func(name, unit, desc string, buckets []float64) metric.Float64Histogram {
		o := []metric.Float64HistogramOption{metric.WithUnit(unit), metric.WithDescription(desc)}
		if buckets != nil {
			o = append(o, metric.WithExplicitBucketBoundaries(buckets...))
		}
		h, err := m.Float64Histogram(name, o...)
		errs = append(errs, err)
		return h
	}
	t.attempts = counter(AcquireAttempts, "{attempt}",
		"Acquisitions by outcome: acquired, failed_open, held (refused at once), timeout (the wait ran out), canceled, error.")
	t.renewals = counter(Renewals, "{renewal}",
		"Renewals by outcome: ok, refused (the authority no longer had the grant), error (retried until local validity ran out).")
	t.lost = counter(LeasesLost, "{lease}",
		"Leases that ended without their holder releasing them, by reason: refused, expired, broken, closed.")
	t.stale = counter(StaleWrites, "{write}",
		"Writes refused by a fence guard because a newer holder had written: each one is a paused or partitioned holder caught.")
	t.ownerChanges = counter(OwnerChanges, "{change}",
		"Grants that took a key over from another holder (the key was found held, then granted): hand-overs, the key's churn.")
	t.wait = histogram(AcquireWait, "s", "Time from the acquire call to the grant, for granted acquisitions.", t.opts.WaitBuckets)
	t.hold = histogram(LeaseHold, "s", "How long leases were held, from the acquire request to their release or loss.", t.opts.HoldBuckets)
	t.ratio = histogram(LeaseHoldTTLRatio, "1", "Hold time over the lease's TTL: the critical section against the lease length.",
		t.opts.RatioBuckets)

	held, err := m.Int64ObservableGauge(LeasesHeld, metric.WithUnit("{lease}"), metric.WithDescription("Leases held now."))
	errs = append(errs, err)
	validity, err := m.Float64ObservableGauge(ValidityRemaining, metric.WithUnit("s"),
		metric.WithDescription("The least local validity left among the leases held now: how close the next loss is if renewals stop. "+
			"Absent when none is held."))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for _, g := range t.tracker.Gauges() {
			set := metric.WithAttributeSet(labelSet(g.Labels))
			o.ObserveInt64(held, int64(g.Held), set)
			if g.Held > 0 {
				o.ObserveFloat64(validity, g.MinRemaining.Seconds(), set)
			}
		}
		return nil
	}, held, validity)
	if err != nil {
		return nil, err
	}
	if t.parts, err = newPartitionsInstruments(m, t.opts.WaitBuckets); err != nil {
		return nil, err
	}
	return t, nil
}

// Hook returns the hook of a client on store (a short name such as the
// URL scheme; it becomes the store attribute).
func (t *Telemetry) Hook(store string) func(fenced.Event) {
	var h func(fenced.Event)
	if t.attempts != nil {
		h = metrics.Hook(store, t.tracker, recorder{t})
	}
	if t.tracer == nil {
		return h
	}
	return metrics.Join(h, t.spanHook(store))
}

func labelSet(l metrics.Labels, extra ...attribute.KeyValue) attribute.Set {
	return attribute.NewSet(append(extra, attribute.String(metrics.LabelStore, l.Store),
		attribute.String(metrics.LabelKeyGroup, l.KeyGroup))...)
}

// recorder implements metrics.Recorder on t's instruments.
type recorder struct{ t *Telemetry }

var bg = context.Background()

func with(l metrics.Labels, extra ...attribute.KeyValue) metric.MeasurementOption {
	return metric.WithAttributeSet(labelSet(l, extra...))
}

func (r recorder) Init(l metrics.Labels) {
	for _, v := range metrics.AcquireResults {
		r.t.attempts.Add(bg, 0, with(l, attribute.String(metrics.LabelResult, v)))
	}
	for _, v := range metrics.RenewResults {
		r.t.renewals.Add(bg, 0, with(l, attribute.String(metrics.LabelResult, v)))
	}
	for _, v := range metrics.LostReasons {
		r.t.lost.Add(bg, 0, with(l, attribute.String(metrics.LabelReason, v)))
	}
	r.t.stale.Add(bg, 0, with(l))
	r.t.ownerChanges.Add(bg, 0, with(l))
}

func (r recorder) AcquireAttempt(l metrics.Labels, result string) {
	r.t.attempts.Add(bg, 1, with(l, attribute.String(metrics.LabelResult, result)))
}

func (r recorder) AcquireWait(l metrics.Labels, wait time.Duration) {
	r.t.wait.Record(bg, wait.Seconds(), with(l))
}

func (r recorder) Hold(l metrics.Labels, held, ttl time.Duration) {
	r.t.hold.Record(bg, held.Seconds(), with(l))
	if ttl > 0 {
		r.t.ratio.Record(bg, held.Seconds()/ttl.Seconds(), with(l))
	}
}

func (r recorder) Renewal(l metrics.Labels, result string) {
	r.t.renewals.Add(bg, 1, with(l, attribute.String(metrics.LabelResult, result)))
}

func (r recorder) Lost(l metrics.Labels, reason string) {
	r.t.lost.Add(bg, 1, with(l, attribute.String(metrics.LabelReason, reason)))
}

func (r recorder) StaleWrite(l metrics.Labels) { r.t.stale.Add(bg, 1, with(l)) }

func (r recorder) OwnerChange(l metrics.Labels) { r.t.ownerChanges.Add(bg, 1, with(l)) }

// spanHook records the acquire and hold spans.
func (t *Telemetry) spanHook(store string) func(fenced.Event) {
	attrs := func(e fenced.Event, extra ...attribute.KeyValue) []attribute.KeyValue {
		a := append(extra, AttrStore.String(store), AttrKeyGroup.String(t.tracker.GroupOf(e)))
		if t.opts.RecordKey {
			a = append(a, AttrKey.String(e.Key))
		}
		return a
	}
	return func(e fenced.Event) {
		switch e.Kind {
		case fenced.EventAcquire:
			parent := e.Context
			if parent == nil {
				parent = context.Background()
			}
			end := time.Now()
			result := metrics.AcquireResult(e)
			_, span := t.tracer.Start(parent, SpanAcquire, trace.WithTimestamp(end.Add(-e.Duration)),
				trace.WithSpanKind(trace.SpanKindClient),
				trace.WithAttributes(attrs(e, AttrResult.String(result), AttrAttempts.Int(e.Attempt),
					AttrFence.Int64(int64(e.Fence)))...))
			if result == metrics.ResultError {
				span.RecordError(e.Err)
				span.SetStatus(codes.Error, e.Err.Error())
			}
			span.End(trace.WithTimestamp(end))
			if e.Lease == nil || result != metrics.ResultAcquired {
				return
			}
			_, hold := t.tracer.Start(parent, SpanHold, trace.WithTimestamp(end),
				trace.WithLinks(trace.Link{SpanContext: span.SpanContext()}),
				trace.WithAttributes(attrs(e, AttrFence.Int64(int64(e.Fence)), AttrTTL.Float64(e.Lease.Options().TTL.Seconds()))...))
			t.mu.Lock()
			t.holds[e.Lease] = hold
			t.mu.Unlock()
		case fenced.EventRenew:
			if span := t.holdSpan(e.Lease, false); span != nil && e.Err != nil {
				span.AddEvent("renewal failed",
					trace.WithAttributes(AttrResult.String(metrics.RenewResult(e.Err)), attribute.String("error", e.Err.Error())))
			}
		case fenced.EventLost:
			if span := t.holdSpan(e.Lease, true); span != nil {
				reason := metrics.LostReason(e.Err)
				span.AddEvent("lost", trace.WithAttributes(AttrReason.String(reason), attribute.String("cause", e.Err.Error())))
				span.SetStatus(codes.Error, "lease lost: "+reason)
				span.End()
			}
		case fenced.EventRelease:
			if span := t.holdSpan(e.Lease, true); span != nil {
				if errors.Is(e.Lease.Err(), fenced.ErrClosed) {
					span.AddEvent("lost", trace.WithAttributes(AttrReason.String(metrics.LostClosed)))
					span.SetStatus(codes.Error, "lease lost: "+metrics.LostClosed)
				}
				span.End()
			}
		}
	}
}

// holdSpan returns the hold span of l, forgetting it when end is set.
func (t *Telemetry) holdSpan(l *fenced.Lease, end bool) trace.Span {
	t.mu.Lock()
	defer t.mu.Unlock()
	span := t.holds[l]
	if end {
		delete(t.holds, l)
	}
	return span
}
