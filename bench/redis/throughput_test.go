package redisbench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkThroughput runs acquire-release loops on K keys from C
// goroutines sharing one go-redis client, for fenced and each incumbent,
// in 2s windows that alternate between the implementations in shuffled
// order (two windows each), and reports each one's ops/s, acquire p99,
// the server's commands per op (INFO commandstats), and the CPU time per
// op of this process (the clients: client-cpu-µs/op) and of the server
// (server-cpu-µs/op). On a loaded machine ops/s moves with whatever else
// runs, while the CPU an op costs moves much less: with two cores shared
// by clients and server, it is what decides the throughput. The b.N loop
// is not used: run it with -benchtime 1x.
//
//	cd bench/redis && go test -run '^$' -bench Throughput -benchtime 1x
func BenchmarkThroughput(b *testing.B) {
	srv := startServer(b)
	for _, cell := range []struct{ keys, clients int }{{10_000, 64}, {100, 64}, {1, 64}} {
		b.Run(fmt.Sprintf("K=%d/C=%d", cell.keys, cell.clients), func(b *testing.B) {
			type result struct {
				ops  int64
				took time.Duration
				lat  []time.Duration
				cmds int64
				srv  serverCalls
				cpu  cpuTimes
			}
			results := map[string]*result{}
			add := func(r *result, s serverCalls) {
				if r.srv == nil {
					r.srv = serverCalls{}
				}
				for name, n := range s {
					r.srv[name] += n
				}
			}
			lockers := map[string]locker{}
			var order []string
			for _, ct := range contenders {
				c, _ := newClient(b, srv)
				lockers[ct.name] = ct.make(b, c)
				results[ct.name] = &result{}
				order = append(order, ct.name)
			}
			probe, _ := newClient(b, srv)
			run := fmt.Sprintf("%x", rand.Uint64())
			for window := 0; window < 2; window++ {
				rand.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
				for _, name := range order {
					r := results[name]
					before, cpu := readServerCalls(b, probe), readCPU(b, probe)
					ops, lat, took := loop(b, lockers[name], fmt.Sprintf("bench:tp:%s:%s", run, name), cell.keys, cell.clients, 2*time.Second)
					used := readCPU(b, probe).since(cpu)
					served := readServerCalls(b, probe).since(before)
					r.cpu.process += used.process
					r.cpu.server += used.server
					r.cmds += served.commands()
					add(r, served)
					r.ops += ops
					r.took += took
					r.lat = append(r.lat, lat...)
				}
			}
			sort.Strings(order)
			for _, name := range order {
				r := results[name]
				sort.Slice(r.lat, func(i, j int) bool { return r.lat[i] < r.lat[j] })
				p99 := time.Duration(0)
				if len(r.lat) > 0 {
					p99 = r.lat[int(0.99*float64(len(r.lat)-1))]
				}
				b.ReportMetric(float64(r.ops)/r.took.Seconds(), name+"-ops/s")
				b.ReportMetric(float64(p99.Microseconds()), name+"-acquire-p99-µs")
				b.ReportMetric(float64(r.cmds)/float64(max(r.ops, 1)), name+"-srvcmds/op")
				b.ReportMetric(float64(r.cpu.process.Nanoseconds())/1e3/float64(max(r.ops, 1)), name+"-client-cpu-µs/op")
				b.ReportMetric(float64(r.cpu.server.Nanoseconds())/1e3/float64(max(r.ops, 1)), name+"-server-cpu-µs/op")
				b.Logf("%s: %d ops, server: %v", name, r.ops, r.srv)
			}
		})
	}
}

// loop runs clients goroutines that acquire and release random keys of
// keys (named prefix:i) through l for d, and returns the pairs done, the
// acquire latencies and the time taken.
func loop(b *testing.B, l locker, prefix string, keys, clients int, d time.Duration) (int64, []time.Duration, time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var (
		ops atomic.Int64
		mu  sync.Mutex
		all []time.Duration
		wg  sync.WaitGroup
	)
	start := time.Now()
	for w := 0; w < clients; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var lat []time.Duration
			for ctx.Err() == nil {
				key := fmt.Sprintf("%s:%d", prefix, rand.IntN(keys))
				t := time.Now()
				unlock, err := l.lock(ctx, key)
				if err != nil {
					continue // the window ended while waiting
				}
				lat = append(lat, time.Since(t))
				if err := unlock(context.Background()); err != nil {
					b.Error(err)
					return
				}
				ops.Add(1)
			}
			mu.Lock()
			all = append(all, lat...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return ops.Load(), all, time.Since(start)
}
