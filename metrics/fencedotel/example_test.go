package fencedotel_test

import (
	"context"
	"fmt"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/fenced-dev/fenced"
	_ "github.com/fenced-dev/fenced/mem"
	"github.com/fenced-dev/fenced/metrics/fencedotel"
)

func Example() {
	ctx := context.Background()
	reader := sdkmetric.NewManualReader() // in production: a periodic OTLP exporter
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))

	tel, err := fencedotel.New(mp, tp, nil)
	if err != nil {
		panic(err)
	}
	client, err := fenced.Open(ctx, "mem://otel-example", &fenced.Options{Hook: tel.Hook("mem")})
	if err != nil {
		panic(err)
	}
	defer client.Close()
	lease, err := client.TryAcquire(ctx, "invoice:inv_72", nil)
	if err != nil {
		panic(err)
	}
	lease.Release(ctx)

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		panic(err)
	}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if m.Name == fencedotel.LeaseHold {
			fmt.Println(m.Name, "unit", m.Unit, "samples", m.Data.(metricdata.Histogram[float64]).DataPoints[0].Count)
		}
	}
	for _, s := range spans.Ended() {
		fmt.Println("span", s.Name())
	}
	// Output:
	// fenced.lease.hold unit s samples 1
	// span fenced.acquire
	// span fenced.hold
}
