package fenced_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/testkit/leasebench"
	"github.com/fenced-dev/fenced/mem"
)

// The benchmarks in this file measure what the portable Client costs on
// top of its driver, on the mem reference driver (so the figure is the
// Client's own cost, without a network):
//
//	go test -run XXX -bench 'ClientCost|PairAllocs' -benchtime 20000x .
//	FENCED_HOLD_LEASES=100000 go test -run XXX -bench HeldLeases -benchtime 1x -timeout 30m .
//
// ClientCost interleaves the driver's and the Client's uncontended
// acquire+release in shuffled order in one loop (the only comparison this
// noisy machine allows) and reports both means and p50s, the difference of
// the means, and the median over rounds of the Client's time minus the
// driver's in the same round (overhead-paired-ns). PairAllocs reports the allocations of each (deterministic, so
// separate sub-benchmarks are fine). HeldLeases holds M leases on one
// client and reports heap bytes and goroutines per held lease, the client's
// CPU seconds per second and the renewal requests per renewal period.

// costOptions are the two lease shapes measured: the bench/redis shape
// (waits, no fence, no renewal) and the package defaults (no wait, strict
// fence, automatic renewal), which register every grant with the renewer.
var costOptions = []struct {
	name string
	opts fenced.LeaseOptions
	do   bool // through Client.Do instead of Acquire and Release
}{
	{"wait-norenew", fenced.LeaseOptions{TTL: 10 * time.Second, MaxWait: fenced.WaitForever, MinFence: fenced.FenceNone, ManualRenew: true}, false},
	{"defaults", fenced.LeaseOptions{TTL: 10 * time.Second}, false},
	{"do-defaults", fenced.LeaseOptions{TTL: 10 * time.Second}, true},
}

// driverPair is the driver's own acquire+release, with an owner token made
// the way a careful caller would (crypto/rand).
func driverPair(ctx context.Context, d driver.Driver, key string) error {
	var b [16]byte
	rand.Read(b[:])
	owner := hex.EncodeToString(b[:])
	f, err := d.TryAcquire(ctx, key, owner, 10*time.Second)
	if err != nil {
		return err
	}
	return d.Release(ctx, driver.Grant{Key: key, Owner: owner, Fence: f})
}

func clientPair(ctx context.Context, c *fenced.Client, key string, opts *fenced.LeaseOptions) error {
	return clientPairVia(ctx, c, key, opts, false)
}

func clientPairVia(ctx context.Context, c *fenced.Client, key string, opts *fenced.LeaseOptions, do bool) error {
	if do {
		return c.Do(ctx, key, opts, func(context.Context, *fenced.Lease) error { return nil })
	}
	l, err := c.Acquire(ctx, key, opts)
	if err != nil {
		return err
	}
	return l.Release(ctx)
}

func BenchmarkClientCost(b *testing.B) {
	for _, o := range costOptions {
		b.Run(o.name, func(b *testing.B) {
			ctx := context.Background()
			store := mem.NewStore(nil)
			d := store.Driver()
			c := fenced.NewClient(store.Driver(), nil)
			defer c.Close()
			opts := o.opts
			var drvLat, cliLat []time.Duration
			run := func(client bool, keep bool) {
				start := time.Now()
				var err error
				if client {
					err = clientPairVia(ctx, c, "cost:client", &opts, o.do)
				} else {
					err = driverPair(ctx, d, "cost:driver")
				}
				el := time.Since(start)
				if err != nil {
					b.Fatal(err)
				}
				if !keep {
					return
				}
				if client {
					cliLat = append(cliLat, el)
				} else {
					drvLat = append(drvLat, el)
				}
			}
			for i := 0; i < 200; i++ { // warm-up, discarded
				run(i%2 == 0, false)
				run(i%2 != 0, false)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				first := mrand.IntN(2) == 0
				run(first, true)
				run(!first, true)
			}
			b.StopTimer()
			dm, cm := mean(drvLat), mean(cliLat)
			diffs := make([]time.Duration, len(cliLat))
			for i := range diffs {
				diffs[i] = cliLat[i] - drvLat[i]
			}
			b.ReportMetric(float64(pct(diffs, 50)), "overhead-paired-ns")
			b.ReportMetric(dm, "driver-ns/pair")
			b.ReportMetric(cm, "client-ns/pair")
			b.ReportMetric(cm-dm, "overhead-ns/pair")
			b.ReportMetric(float64(pct(drvLat, 50)), "driver-p50-ns")
			b.ReportMetric(float64(pct(cliLat, 50)), "client-p50-ns")
			b.ReportMetric(float64(pct(cliLat, 99)), "client-p99-ns")
			b.ReportMetric(0, "ns/op")
		})
	}
}

func BenchmarkPairAllocs(b *testing.B) {
	ctx := context.Background()
	b.Run("driver", func(b *testing.B) {
		d := mem.New(nil)
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if err := driverPair(ctx, d, "allocs"); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, o := range costOptions {
		b.Run("client-"+o.name, func(b *testing.B) {
			c := fenced.NewClient(mem.New(nil), nil)
			defer c.Close()
			opts := o.opts
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if err := clientPairVia(ctx, c, "allocs", &opts, o.do); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func mean(d []time.Duration) float64 {
	var sum time.Duration
	for _, x := range d {
		sum += x
	}
	return float64(sum) / float64(max(len(d), 1))
}

func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[(len(s)-1)*p/100]
}

// countingRenewals wraps a driver and counts renewal requests: single
// renewals and batches, and the grants the batches carried.
type countingRenewals struct {
	driver.Driver
	singles, batches, batched atomic.Int64
}

func (d *countingRenewals) Renew(ctx context.Context, g driver.Grant) error {
	d.singles.Add(1)
	return d.Driver.Renew(ctx, g)
}

// countingBatches adds driver.BatchRenewer to countingRenewals.
type countingBatches struct{ *countingRenewals }

func (d countingBatches) RenewBatch(ctx context.Context, grants []driver.Grant) ([]error, error) {
	d.batches.Add(1)
	d.batched.Add(int64(len(grants)))
	errs := make([]error, len(grants))
	for i, g := range grants {
		errs[i] = d.Driver.Renew(ctx, g)
	}
	return errs, nil
}

// BenchmarkHeldLeases holds FENCED_HOLD_LEASES leases (default 10 000) on
// one client over the mem driver, with the default TTL/3 renewal, for
// FENCED_HOLD_PERIODS renewal periods (default 3), and reports per held
// lease the live heap (after GC, over the heap before the leases), the
// goroutine stacks and the goroutines; the process's CPU seconds per second
// while holding (the mem authority runs in-process, so this includes its
// share: a CPU profile, FENCED_HOLD_CPUPROFILE, tells the two apart); the
// renewal requests per period and the grants they renewed; and leases lost (must be 0). FENCED_HOLD_TTL_MS sets the TTL
// (default 6000), FENCED_HOLD_BATCH=0 hides the driver's BatchRenewer, and
// FENCED_HOLD_CPUPROFILE names a file for a CPU profile of the holding.
func BenchmarkHeldLeases(b *testing.B) {
	m := leasebench.EnvInt("FENCED_HOLD_LEASES", 10000)
	periods := leasebench.EnvInt("FENCED_HOLD_PERIODS", 3)
	ttl := time.Duration(leasebench.EnvInt("FENCED_HOLD_TTL_MS", 6000)) * time.Millisecond
	batch := leasebench.EnvInt("FENCED_HOLD_BATCH", 1) != 0
	for i := 0; i < b.N; i++ {
		holdLeases(b, m, periods, ttl, batch)
	}
}

func holdLeases(b *testing.B, m, periods int, ttl time.Duration, batch bool) {
	ctx := context.Background()
	store := mem.NewStore(nil)
	// Keys are made before the baseline, as an application has its own.
	keys := make([]string, m)
	for i := range keys {
		keys[i] = fmt.Sprintf("hold:%08d", i)
	}
	counted := &countingRenewals{Driver: store.Driver()}
	var drv driver.Driver = counted
	if batch {
		drv = countingBatches{counted}
	}
	var lost atomic.Int64
	c := fenced.NewClient(drv, &fenced.Options{Hook: func(e fenced.Event) {
		if e.Kind == fenced.EventLost {
			lost.Add(1)
		}
	}})
	defer c.Close()
	// The store's own memory per key is not the client's: grant and
	// release every key once first, so the baseline includes the store's
	// entries.
	for _, k := range keys {
		if err := clientPair(ctx, c, k, &fenced.LeaseOptions{TTL: ttl, ManualRenew: true}); err != nil {
			b.Fatal(err)
		}
	}
	leases := make([]*fenced.Lease, m)
	heap0, stack0 := leasebench.LiveMemory()
	g0 := runtime.NumGoroutine()
	b.ResetTimer()
	began := time.Now()
	var wg sync.WaitGroup
	var next atomic.Int64
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= m {
					return
				}
				l, err := c.TryAcquire(ctx, keys[i], &fenced.LeaseOptions{TTL: ttl})
				if err != nil {
					b.Error(err)
					return
				}
				leases[i] = l
			}
		}()
	}
	wg.Wait()
	acquireTook := time.Since(began)
	heap1, stack1 := leasebench.LiveMemory()
	g1 := runtime.NumGoroutine()
	// Hold for the periods, measuring CPU and renewal requests.
	period := ttl / 3
	cpu0, wall0 := leasebench.CPUTime(), time.Now()
	s0, b0, n0 := counted.singles.Load(), counted.batches.Load(), counted.batched.Load()
	if path := os.Getenv("FENCED_HOLD_CPUPROFILE"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			b.Fatal(err)
		}
		pprof.StartCPUProfile(f)
		defer f.Close()
	}
	time.Sleep(time.Duration(periods) * period)
	pprof.StopCPUProfile()
	cpu, wall := leasebench.CPUTime()-cpu0, time.Since(wall0)
	s1, b1, n1 := counted.singles.Load(), counted.batches.Load(), counted.batched.Load()
	b.StopTimer()
	perPeriod := func(n int64) float64 { return float64(n) / (float64(wall) / float64(period)) }
	ended := 0
	for _, l := range leases {
		if l != nil && l.Err() != nil {
			ended++
		}
	}
	figures := []struct {
		v    float64
		unit string
	}{
		{float64(int64(heap1)-int64(heap0)) / float64(m), "heap-B/lease"},
		{float64(int64(stack1)-int64(stack0)) / float64(m), "stack-B/lease"},
		{float64(g1-g0) / float64(m), "goroutines/lease"},
		{cpu.Seconds() / wall.Seconds(), "cpu-s/s"},
		{perPeriod(s1 - s0 + b1 - b0), "renew-calls/period"},
		{perPeriod(n1 - n0 + s1 - s0), "grants-renewed/period"},
		{float64(lost.Load()), "lost"},
		{acquireTook.Seconds(), "acquire-s"},
	}
	for _, f := range figures {
		b.ReportMetric(f.v, f.unit)
	}
	b.ReportMetric(0, "ns/op")
	if ended > 0 {
		// A failed benchmark prints no metrics: log them.
		b.Logf("M=%d: %+v", m, figures)
		b.Errorf("%d of %d leases ended while held", ended, m)
	}
	b.StartTimer()
}
