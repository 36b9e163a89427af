package redisbench

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// serverCalls is what a redis-server counted in INFO commandstats: calls
// per command name. A script's EVALSHA counts once under evalsha, and every
// redis.call inside it once more under its own name, so the total is what
// the single-threaded server executed.
type serverCalls map[string]int64

// readServerCalls reads INFO commandstats through c.
func readServerCalls(b *testing.B, c *redis.Client) serverCalls {
	b.Helper()
	s, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	out := serverCalls{}
	for _, line := range strings.Split(s, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		n, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			b.Fatalf("commandstats line %q: %v", line, err)
		}
		out[strings.TrimPrefix(name, "cmdstat_")] = n
	}
	return out
}

// scriptMicros reads the microseconds the server has spent in scripts
// (INFO commandstats usec of EVALSHA and EVAL): how long scripts kept the
// single thread from everyone else.
func scriptMicros(b *testing.B, c *redis.Client) int64 {
	b.Helper()
	s, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var us int64
	for _, line := range strings.Split(s, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "cmdstat_evalsha" && name != "cmdstat_eval") {
			continue
		}
		for _, field := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(field, "usec="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					b.Fatalf("commandstats line %q: %v", line, err)
				}
				us += n
			}
		}
	}
	return us
}

// since returns the calls made between before and s, leaving out the INFO
// calls that read them.
func (s serverCalls) since(before serverCalls) serverCalls {
	d := serverCalls{}
	for name, n := range s {
		if name == "info" {
			continue
		}
		if n -= before[name]; n > 0 {
			d[name] = n
		}
	}
	return d
}

// scripts is the number of script calls (EVAL, EVALSHA, FCALL).
func (s serverCalls) scripts() int64 { return s["evalsha"] + s["eval"] + s["fcall"] }

// commands is the number of data commands executed: those a client sent
// plus those its scripts ran, without the script calls themselves (the
// count the perf issue compares: SET, INCR, GET, DEL, PUBLISH...).
func (s serverCalls) commands() int64 {
	var n int64
	for _, c := range s {
		n += c
	}
	return n - s.scripts()
}

// report adds the server's counts per op to b: srvcmds/<unit> (data
// commands executed, see commands) and scripts/<unit>.
func (s serverCalls) report(b *testing.B, ops int, unit string) {
	if ops <= 0 {
		return
	}
	b.ReportMetric(float64(s.commands())/float64(ops), "srvcmds/"+unit)
	b.ReportMetric(float64(s.scripts())/float64(ops), "scripts/"+unit)
}

// String lists the counts, for logs.
func (s serverCalls) String() string {
	names := make([]string, 0, len(s))
	for name := range s {
		names = append(names, name)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, name := range names {
		fmt.Fprintf(&b, "%s=%d ", name, s[name])
	}
	return strings.TrimSpace(b.String())
}

// cpuTimes is CPU time used so far by this process (user and system, every
// goroutine) and by the redis-server (INFO cpu used_cpu_user and
// used_cpu_sys, every thread).
type cpuTimes struct{ process, server time.Duration }

// readCPU reads both through c (the server's counter has microsecond
// resolution).
func readCPU(b *testing.B, c *redis.Client) cpuTimes {
	b.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	t := cpuTimes{process: time.Duration(ru.Utime.Nano() + ru.Stime.Nano())}
	s, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(s, "\n") {
		name, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "used_cpu_user" && name != "used_cpu_sys") {
			continue
		}
		secs, err := strconv.ParseFloat(v, 64)
		if err != nil {
			b.Fatalf("INFO cpu line %q: %v", line, err)
		}
		t.server += time.Duration(secs * float64(time.Second))
	}
	return t
}

// since returns the CPU time used between before and t.
func (t cpuTimes) since(before cpuTimes) cpuTimes {
	return cpuTimes{process: t.process - before.process, server: t.server - before.server}
}
