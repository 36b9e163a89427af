package redisbench

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedredis"
	"github.com/fenced-dev/fenced/internal/testkit/leasebench"
	"github.com/redis/go-redis/v9"
)

// BenchmarkHeldLeases holds FENCED_HOLD_LEASES leases (default 10 000) on
// one fenced client over one Redis server, with TTL FENCED_HOLD_TTL_MS
// (default 6000) and the default TTL/3 renewal, for FENCED_HOLD_PERIODS
// renewal periods (default 3), and reports: per held lease, the client's
// live heap (after GC, over the heap of the connected client before the
// leases; heap-B/lease is the least of five samples, taken once the leases
// are held and over one more period after the CPU window, and
// heap-max-B/lease the most, which includes a renewal batch in flight),
// goroutine stacks and goroutines; the client process's CPU
// seconds per second while holding (Redis is another process, so this is
// the client and go-redis alone); per renewal period, the commands Redis
// ran (INFO commandstats: script calls and all commands) and the client's
// round trips; and leases lost (must be 0). FENCED_HOLD_HEAPPROFILE names
// a file for a heap profile taken once the leases are held, and
// FENCED_HOLD_CPUPROFILE one for a CPU profile of the holding.
//
//	cd bench/redis && FENCED_BENCH_AOF=0 FENCED_HOLD_LEASES=100000 go test -run XXX -bench HeldLeases -benchtime 1x -timeout 30m
func BenchmarkHeldLeases(b *testing.B) {
	m := leasebench.EnvInt("FENCED_HOLD_LEASES", 10000)
	periods := leasebench.EnvInt("FENCED_HOLD_PERIODS", 3)
	ttl := time.Duration(leasebench.EnvInt("FENCED_HOLD_TTL_MS", 6000)) * time.Millisecond
	srv := startServer(b)
	for i := 0; i < b.N; i++ {
		holdRedisLeases(b, srv.Addr(), m, periods, ttl)
	}
}

func holdRedisLeases(b *testing.B, addr string, m, periods int, ttl time.Duration) {
	ctx := context.Background()
	const inFlight = 64
	rc := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, PoolSize: 128})
	h := &counter{}
	rc.AddHook(h)
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	d, err := fencedredis.New(rc, nil)
	if err != nil {
		b.Fatal(err)
	}
	var (
		lost      atomic.Int64
		firstLoss atomic.Value // why the first lost lease was lost
	)
	c := fenced.NewClient(d, &fenced.Options{Hook: func(e fenced.Event) {
		if e.Kind == fenced.EventLost {
			if lost.Add(1) == 1 {
				firstLoss.Store(fmt.Sprintf("%v (held %v)", e.Err, e.Duration))
			}
		}
	}})
	defer c.Close()
	run := keySeq.Add(1)
	keys := make([]string, m)
	for i := range keys {
		keys[i] = fmt.Sprintf("bench:held:%d:%08d", run, i)
	}
	leases := make([]*fenced.Lease, m)
	// Fill the connection pool and the script cache before the baseline.
	var wg sync.WaitGroup
	for w := 0; w < inFlight; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := c.TryAcquire(ctx, fmt.Sprintf("bench:held:%d:warm:%d", run, w), &fenced.LeaseOptions{TTL: ttl, MinFence: fenced.FenceRepeatable})
			if err != nil {
				b.Error(err)
				return
			}
			if w < 2 {
				// Load the renew script (the driver reloads it after
				// NOSCRIPT, which would count its first batch twice).
				if err := l.Renew(ctx); err != nil {
					b.Error(err)
				}
			}
			l.Release(ctx)
		}()
	}
	wg.Wait()
	heap0, stack0 := leasebench.LiveMemory()
	g0 := runtime.NumGoroutine()
	b.ResetTimer()
	began := time.Now()
	var next atomic.Int64
	for w := 0; w < inFlight; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= m {
					return
				}
				l, err := c.TryAcquire(ctx, keys[i], &fenced.LeaseOptions{TTL: ttl, MinFence: fenced.FenceRepeatable})
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
	if path := os.Getenv("FENCED_HOLD_HEAPPROFILE"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			b.Fatal(err)
		}
		pprof.WriteHeapProfile(f)
		f.Close()
	}

	period := ttl / 3
	calls0 := readServerCalls(b, admin)
	trips0 := h.trips.Load()
	if path := os.Getenv("FENCED_HOLD_CPUPROFILE"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			b.Fatal(err)
		}
		pprof.StartCPUProfile(f)
		defer f.Close()
	}
	cpu0, wall0 := leasebench.CPUTime(), time.Now()
	time.Sleep(time.Duration(periods) * period)
	cpu, wall := leasebench.CPUTime()-cpu0, time.Since(wall0)
	pprof.StopCPUProfile()
	calls := readServerCalls(b, admin).since(calls0)
	trips1 := h.trips.Load()
	// The held leases' memory between renewals, and with a renewal batch
	// in flight: the least and the most of samples over one more period.
	minHeap, maxHeap := heap1, heap1
	for range 4 {
		time.Sleep(period / 4)
		h, _ := leasebench.LiveMemory()
		minHeap, maxHeap = min(minHeap, h), max(maxHeap, h)
	}
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
		{float64(int64(minHeap)-int64(heap0)) / float64(m), "heap-B/lease"},
		{float64(int64(maxHeap)-int64(heap0)) / float64(m), "heap-max-B/lease"},
		{float64(int64(stack1)-int64(stack0)) / float64(m), "stack-B/lease"},
		{float64(g1-g0) / float64(m), "goroutines/lease"},
		{cpu.Seconds() / wall.Seconds(), "cpu-s/s"},
		{perPeriod(calls.scripts()), "server-scripts/period"},
		{perPeriod(calls.scripts() + calls.commands()), "server-commands/period"},
		{perPeriod(trips1 - trips0), "round-trips/period"},
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
		b.Errorf("%d of %d leases ended while held; the first lost: %v", ended, m, firstLoss.Load())
	}
	// Release in bulk through Close (deferred), as an application would.
}
