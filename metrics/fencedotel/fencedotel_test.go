package fencedotel_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/fenced-dev/fenced"
	_ "github.com/fenced-dev/fenced/fencedsqlite"
	"github.com/fenced-dev/fenced/mem"
	"github.com/fenced-dev/fenced/metrics"
	"github.com/fenced-dev/fenced/metrics/fencedotel"
	"github.com/fenced-dev/fenced/metrics/internal/scenario"
)

type point struct {
	group, label string // label: the result or reason, if any
}

// collected reads the manual reader into name → point → value (counters and
// gauges) or sample count (histograms).
func collected(t *testing.T, r *sdkmetric.ManualReader) map[string]map[point]float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]map[point]float64{}
	key := func(set attribute.Set) point {
		var p point
		if v, ok := set.Value(metrics.LabelKeyGroup); ok {
			p.group = v.AsString()
		}
		for _, l := range []attribute.Key{metrics.LabelResult, metrics.LabelReason} {
			if v, ok := set.Value(l); ok {
				p.label = v.AsString()
			}
		}
		if v, _ := set.Value(metrics.LabelStore); v.AsString() != scenario.Store {
			t.Errorf("store attribute %q, want %q", v.AsString(), scenario.Store)
		}
		return p
	}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != fencedotel.ScopeName {
			continue
		}
		for _, m := range sm.Metrics {
			vals := map[point]float64{}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					vals[key(dp.Attributes)] = float64(dp.Value)
				}
			case metricdata.Gauge[int64]:
				for _, dp := range d.DataPoints {
					vals[key(dp.Attributes)] = float64(dp.Value)
				}
			case metricdata.Gauge[float64]:
				for _, dp := range d.DataPoints {
					vals[key(dp.Attributes)] = dp.Value
				}
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					vals[key(dp.Attributes)] = float64(dp.Count)
				}
			default:
				t.Fatalf("%s: unexpected data %T", m.Name, m.Data)
			}
			out[m.Name] = vals
		}
	}
	return out
}

// Every instrument and value after the same scenario as fencedprom's test,
// read with the SDK's ManualReader; the spans of each acquisition and hold;
// and the names the OpenTelemetry Prometheus exporter derives from the
// instruments are exactly fencedprom's.
func TestInstrumentsSpansAndPrometheusNames(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo())
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader), sdkmetric.WithReader(exporter))
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	tel, err := fencedotel.New(mp, tp, nil)
	if err != nil {
		t.Fatal(err)
	}
	scenario.Run(t, tel.Hook, func() {
		got := collected(t, reader)
		if v := got[fencedotel.LeasesHeld][point{group: "invoice"}]; v != 1 {
			t.Errorf("leases held while A holds: %v, want 1", v)
		}
		if v := got[fencedotel.ValidityRemaining][point{group: "invoice"}]; v != scenario.Validity.Seconds() {
			t.Errorf("validity remaining: %v, want %v", v, scenario.Validity.Seconds())
		}
	})

	got := collected(t, reader)
	want := map[string]map[point]float64{
		fencedotel.AcquireAttempts: {
			{"invoice", "acquired"}: 2, {"invoice", "held"}: 1, {"invoice", "timeout"}: 1,
			{"invoice", "failed_open"}: 0, {"invoice", "canceled"}: 0, {"invoice", "error"}: 0,
			{"report", "acquired"}: 2, {"report", "held"}: 0, {"report", "timeout"}: 0,
			{"report", "failed_open"}: 0, {"report", "canceled"}: 0, {"report", "error"}: 0,
		},
		fencedotel.Renewals: {
			{"invoice", "ok"}: 1, {"invoice", "refused"}: 1, {"invoice", "error"}: 0,
			{"report", "ok"}: 0, {"report", "refused"}: 0, {"report", "error"}: 0,
		},
		fencedotel.LeasesLost: {
			{"invoice", "broken"}: 1, {"invoice", "refused"}: 0, {"invoice", "expired"}: 0, {"invoice", "closed"}: 0,
			{"report", "broken"}: 0, {"report", "refused"}: 0, {"report", "expired"}: 1, {"report", "closed"}: 1,
		},
		fencedotel.StaleWrites:       {{"invoice", ""}: 1, {"report", ""}: 0},
		fencedotel.OwnerChanges:      {{"invoice", ""}: 1, {"report", ""}: 0},
		fencedotel.LeasesHeld:        {{"invoice", ""}: 0, {"report", ""}: 0},
		fencedotel.AcquireWait:       {{"invoice", ""}: 2, {"report", ""}: 2},
		fencedotel.LeaseHold:         {{"invoice", ""}: 2, {"report", ""}: 2},
		fencedotel.LeaseHoldTTLRatio: {{"invoice", ""}: 2, {"report", ""}: 2},
		fencedotel.ValidityRemaining: {},
	}
	for name, points := range want {
		for p, v := range points {
			if g, ok := got[name][p]; !ok || g != v {
				t.Errorf("%s%+v = %v (present %v), want %v", name, p, g, ok, v)
			}
		}
		if len(got[name]) != len(points) {
			t.Errorf("%s has %d points, want %d: %v", name, len(got[name]), len(points), got[name])
		}
	}

	// The same series names as fencedprom, through OpenTelemetry's own
	// Prometheus translation.
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "fenced_") {
			names = append(names, mf.GetName())
		}
	}
	wantNames := slices.Clone(metrics.Names)
	names = append(names, metrics.ValidityRemaining) // absent: nothing is held
	slices.Sort(names)
	slices.Sort(wantNames)
	if !slices.Equal(names, wantNames) {
		t.Errorf("OpenTelemetry's Prometheus names:\n%v\nfencedprom's:\n%v", names, wantNames)
	}

	// Spans: one per acquisition, one per hold.
	var acquires, holds []sdktrace.ReadOnlySpan
	for _, s := range spans.Ended() {
		switch s.Name() {
		case fencedotel.SpanAcquire:
			acquires = append(acquires, s)
		case fencedotel.SpanHold:
			holds = append(holds, s)
		}
	}
	if len(acquires) != 6 || len(holds) != 4 {
		t.Fatalf("%d acquire spans (want 6) and %d hold spans (want 4)", len(acquires), len(holds))
	}
	var broken sdktrace.ReadOnlySpan
	for _, s := range holds {
		for _, e := range s.Events() {
			for _, a := range e.Attributes {
				if a.Key == fencedotel.AttrReason && a.Value.AsString() == metrics.LostBroken {
					broken = s
				}
			}
		}
	}
	if broken == nil || broken.Status().Code != codes.Error || len(broken.Links()) != 1 {
		t.Fatalf("no hold span with a broken loss, an error status and a link to its acquire span")
	}
	renewFailed := false
	for _, e := range broken.Events() {
		renewFailed = renewFailed || e.Name == "renewal failed"
	}
	if !renewFailed {
		t.Error("the broken lease's hold span has no refused renewal event")
	}
	for _, s := range append(acquires, holds...) {
		for _, a := range s.Attributes() {
			if a.Key == fencedotel.AttrKey {
				t.Fatalf("span %s records the key without RecordKey", s.Name())
			}
		}
	}
}

// The acquire and hold spans are children of the span in the caller's
// context.
func TestSpansParentToCaller(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	tel, err := fencedotel.New(nil, tp, &fencedotel.Options{RecordKey: true})
	if err != nil {
		t.Fatal(err)
	}
	c := fenced.NewClient(mem.New(nil), &fenced.Options{Hook: tel.Hook("mem")})
	defer c.Close()
	ctx, parent := tp.Tracer("test").Start(context.Background(), "request")
	l, err := c.TryAcquire(ctx, "invoice:inv_72", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	parent.End()
	ended := spans.Ended()
	if len(ended) != 3 {
		t.Fatalf("%d spans, want acquire, hold and request", len(ended))
	}
	for _, s := range ended[:2] {
		if s.Parent().SpanID() != parent.SpanContext().SpanID() {
			t.Errorf("span %s is not a child of the caller's span", s.Name())
		}
		found := false
		for _, a := range s.Attributes() {
			found = found || (a.Key == fencedotel.AttrKey && a.Value.AsString() == "invoice:inv_72")
		}
		if !found {
			t.Errorf("span %s lacks the key with RecordKey set", s.Name())
		}
	}
}

// TestGroupInstruments: the group scenario of fencedprom's test, on the
// embedded SQLite store and on mem, read through OpenTelemetry's own
// Prometheus exporter, so the instruments' translated names are
// fencedprom's; the same label values at 16 and 64 partitions.
func TestGroupInstruments(t *testing.T) { scenario.GroupsBounded(t, otelExporter()) }

// otelExporter returns a Telemetry on a MeterProvider of its own for each
// member, as each member process would have, exported to a Prometheus
// registry by OpenTelemetry's exporter.
func otelExporter() func(testing.TB) scenario.Exporter {
	return func(t testing.TB) scenario.Exporter {
		reg := prometheus.NewRegistry()
		exporter, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo())
		if err != nil {
			t.Fatal(err)
		}
		tel, err := fencedotel.New(sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter)), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		return scenario.Exporter{Hook: tel.Hook, Gatherer: reg, Attach: tel.ObservePartitions}
	}
}
