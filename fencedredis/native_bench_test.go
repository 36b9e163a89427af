package fencedredis_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/fencedredis"
	"github.com/fenced-dev/fenced/internal/backend/rediskit"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// serverCPU returns the server's CPU time so far (INFO cpu, user + system).
func serverCPU(b *testing.B, c *redis.Client) time.Duration {
	b.Helper()
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		name, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (name == "used_cpu_user" || name == "used_cpu_sys") {
			f, _ := strconv.ParseFloat(v, 64)
			total += f
		}
	}
	return time.Duration(total * float64(time.Second))
}

// commandTime returns the time the server spent executing commands so far
// (INFO commandstats: the usec of every top-level command; a script's
// commands are inside its EVALSHA's).
func commandTime(b *testing.B, c *redis.Client) time.Duration {
	b.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total time.Duration
	for _, line := range strings.Split(info, "\n") {
		_, rest, ok := strings.Cut(line, ",usec=")
		if !ok {
			continue
		}
		us, _ := strconv.Atoi(strings.SplitN(rest, ",", 2)[0])
		total += time.Duration(us) * time.Microsecond
	}
	return total
}

// BenchmarkNativeVsScript compares, on the server the suite runs, an
// uncontended acquire, renew and release whose renewal is the server's
// conditional SET IFEQ with the same cycle by script, in
// interleaved batches so that both meet the same machine load. It reports
// the server's CPU per cycle (INFO cpu: the whole process, its event loop
// and system calls included), its command time per cycle (INFO
// commandstats: the commands and scripts alone), and the p50 and p99 of the cycle's
// wall time for each path. On a server without the commands both paths
// are the scripts.
//
//	FENCED_REDIS_DIR=~/.cache/fenced/servers/redis-8 go test -run '^$' -bench NativeVsScript -benchtime 20000x ./fencedredis
func BenchmarkNativeVsScript(b *testing.B) {
	// No append-only file: its fsync on every write would be most of the
	// server's CPU, and the same on both paths.
	srv := testenv.StartRedis(b, testenv.RedisConfig{NoPersistence: true})
	b.Logf("%v", testenv.RedisVersion(b))
	ctx := context.Background()
	native, script := newDriver(b, srv, nil), newDriver(b, srv, nil)
	info := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer info.Close()
	probed, err := rediskit.ProbeNative(ctx, info, "probe")
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("native: %s", probed)
	fencedredis.SetCommands(native, probed)
	fencedredis.SetCommands(script, rediskit.Native{})
	o := owner()
	cycle := func(d *fencedredis.Driver) {
		f, err := d.TryAcquire(ctx, "bench", o, time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		g := driver.Grant{Key: "bench", Owner: o, Fence: f, TTL: time.Minute}
		if err := d.Renew(ctx, g); err != nil {
			b.Fatal(err)
		}
		if err := d.Release(ctx, g); err != nil {
			b.Fatal(err)
		}
	}
	type path struct {
		name  string
		d     *fencedredis.Driver
		cpu   time.Duration
		cmd   time.Duration
		walls []time.Duration
	}
	paths := []*path{{name: "native", d: native}, {name: "script", d: script}}
	const batch = 500
	b.ResetTimer()
	for done := 0; done < b.N; done += batch {
		n := min(batch, b.N-done)
		for _, p := range paths {
			cpu, cmd := serverCPU(b, info), commandTime(b, info)
			for range n {
				start := time.Now()
				cycle(p.d)
				p.walls = append(p.walls, time.Since(start))
			}
			p.cpu += serverCPU(b, info) - cpu
			p.cmd += commandTime(b, info) - cmd
		}
	}
	b.StopTimer()
	for _, p := range paths {
		slices.Sort(p.walls)
		q := func(f float64) float64 { return float64(p.walls[int(f*float64(len(p.walls)-1))].Microseconds()) }
		b.ReportMetric(float64(p.cpu.Microseconds())/float64(b.N), p.name+"-server-cpu-us/cycle")
		b.ReportMetric(float64(p.cmd.Nanoseconds())/1e3/float64(b.N), p.name+"-command-us/cycle")
		b.ReportMetric(q(0.50), p.name+"-p50-us")
		b.ReportMetric(q(0.99), p.name+"-p99-us")
	}
}
