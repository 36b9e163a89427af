package main

import (
	"cmp"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// renderReport writes docs (Markdown) and its SVG charts, in a directory
// named after it without the extension, from res, whose JSON is at
// jsonPath.
func renderReport(res Results, jsonPath, docs string) error {
	chartDir := strings.TrimSuffix(docs, filepath.Ext(docs))
	if err := os.MkdirAll(chartDir, 0o755); err != nil {
		return err
	}
	// Charts of an earlier run that this one lacks must not linger.
	old, err := filepath.Glob(filepath.Join(chartDir, "*.svg"))
	if err != nil {
		return err
	}
	for _, f := range old {
		if err := os.Remove(f); err != nil {
			return err
		}
	}
	rw := &reportWriter{docs: docs, chartDir: chartDir}
	rw.intro(res, jsonPath)
	if rs := byWorkload(res, "uncontended"); len(rs) > 0 {
		rw.uncontended(rs)
	}
	if rs := byWorkload(res, "handover"); len(rs) > 0 {
		if err := rw.handover(rs); err != nil {
			return err
		}
	}
	if rs := byWorkload(res, "throughput"); len(rs) > 0 {
		if err := rw.throughput(rs); err != nil {
			return err
		}
	}
	if rs := byWorkload(res, "renewal"); len(rs) > 0 {
		if err := rw.renewal(rs); err != nil {
			return err
		}
		writePeers(rw.w, rs)
	}
	rw.failures(res.Rows)
	return os.WriteFile(docs, []byte(rw.md.String()), 0o644)
}

// reportWriter builds the report's Markdown, one method per section.
// Its charts go in chartDir.
type reportWriter struct {
	md       strings.Builder
	docs     string // the report's path
	chartDir string
}

// w appends formatted text to the report.
func (rw *reportWriter) w(format string, args ...any) { fmt.Fprintf(&rw.md, format, args...) }

// rel returns target's path relative to the report's directory.
// On error it returns target unchanged.
func (rw *reportWriter) rel(target string) string {
	absDocs, err1 := filepath.Abs(rw.docs)
	absTarget, err2 := filepath.Abs(target)
	if err1 != nil || err2 != nil {
		return target
	}
	r, err := filepath.Rel(filepath.Dir(absDocs), absTarget)
	if err != nil {
		return target
	}
	return filepath.ToSlash(r)
}

// writeChart writes c as file in chartDir and returns its path.
func (rw *reportWriter) writeChart(c chart, file string) (string, error) {
	name := filepath.Join(rw.chartDir, file)
	return name, os.WriteFile(name, []byte(c.svg()), 0o644)
}

// byWorkload returns the rows of workload name that completed.
func byWorkload(res Results, name string) []Row {
	var rs []Row
	for _, r := range res.Rows {
		if r.Workload == name && r.Error == "" {
			rs = append(rs, r)
		}
	}
	return rs
}

// intro writes the title, how the run was made and its notes.
func (rw *reportWriter) intro(res Results, jsonPath string) {
	w := rw.w
	mode := "full run"
	if res.Quick {
		mode = "quick run (`--quick`)"
	}
	w("# Benchmarks\n\n")
	w("Measured %s on %s, %s, %.0f s. Command: `%s`. Raw figures: [%s](%s).\n\n",
		res.Date, res.Machine, mode, res.Seconds, cmp.Or(res.Command, "./scripts/bench.sh"), filepath.Base(jsonPath), rw.rel(jsonPath))
	w("Every comparison is interleaved: a workload runs in rounds, each implementation once per round in a fresh random\n")
	w("order, and the first round (the warm-up) is dropped, so load from elsewhere on the machine hits all of them alike.\n")
	w("Servers are started by the run itself (internal/testkit/testenv) on loopback; all implementations of a backend share\n")
	w("its server. **Ratio** is fenced ÷ the best incumbent measured in the same run on the same backend: for latencies\n")
	w("below 1 means fenced is faster, for throughput above 1 means fenced does more. *fenced* is the portable Client with\n")
	w("default options (auto-renew on); *fenced-driver* is the backend's driver called directly, without the Client.\n")
	w("Requests are counted on the server side (see the notes per backend). Redis runs twice: *redis* without the\n")
	w("append-only file, as most Redis lock users run it (the headline: client and script costs show), and *redis-aof*\n")
	w("with appendfsync always, where every write waits for an fsync that hides them. None of the Redis incumbents gives\n")
	w("a fencing token: redsync, redislock (v0.9.4, the newest release: no fence option) and rueidislock; only fenced's\n")
	w("grants carry one (an INCR inside the grant's script).\n\n")
	for _, n := range res.Notes {
		w("- %s\n", n)
	}
	w("\n")
}

// uncontended writes the section on acquire + release of a free key.
func (rw *reportWriter) uncontended(rs []Row) {
	w := rw.w
	w("## Uncontended acquire + release\n\n")
	w("One key, free: acquire then release, one after the other, from one process.\n\n")
	w("| backend | implementation | p50 µs | p99 µs | requests/op | ratio p50 | ratio p99 |\n" +
		"| --- | --- | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range rs {
		w("| %s | %s | %s | %s | %s | %s | %s |\n", r.Backend, r.Implementation, num(r.P50us), num(r.P99us), reqs(r.RequestsPerOp),
			ratioCell(r, rs, sameParams, func(r Row) float64 { return r.P50us }, false),
			ratioCell(r, rs, sameParams, func(r Row) float64 { return r.P99us }, false))
	}
	w("\n")
	for _, b := range backendsOf(rs) {
		f, okF := find(rs, b, "fenced")
		d, okD := find(rs, b, "fenced-driver")
		if okF && okD {
			w("- %s: the Client costs %+.0f µs at p50 over its driver (%s vs %s µs).\n", b, f.P50us-d.P50us, num(f.P50us), num(d.P50us))
		}
	}
	w("\n")
}

// handover writes the handover section and its charts, one per backend.
func (rw *reportWriter) handover(rs []Row) error {
	w := rw.w
	w("## Handover\n\n")
	w("From the holder's release call to the next holder's acquire returning, with N waiters on one key, each an operating\n")
	w("system process of its own (the suite's binary run as a child: its own Go runtime, client and connections, driven\n")
	w("over a pipe; both ends are stamped inside the participants' processes, on the wall clock they share, so the pipe's\n")
	w("latency is not counted). With 64 waiters 65 processes share the machine's 2 cores, as they would share a node. A\n")
	w("holder releases only once every other participant is inside its acquire call\n")
	w("(plus 20–40 ms, at random, for every waiter to be in line: watch, subscription or queue entry in place), " +
		"and does not contend again until someone else got the key, so each sample is a\n")
	w("real handover. Requests per handover include the waiters' polling, counted from a round's first grant to its last\n")
	w("measured one (not the drain after it, when every participant still waiting takes the key once).\n\n")
	w("| backend | waiters | implementation | p50 µs | p99 µs | requests/handover | ratio p50 | ratio p99 |\n" +
		"| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range rs {
		w("| %s | %v | %s | %s | %s | %s | %s | %s |\n", r.Backend, r.Params["waiters"], r.Implementation, num(r.P50us), num(r.P99us),
			reqs(r.RequestsPerOp),
			ratioCell(r, rs, sameParams, func(r Row) float64 { return r.P50us }, false),
			ratioCell(r, rs, sameParams, func(r Row) float64 { return r.P99us }, false))
	}
	w("\n")
	for _, b := range backendsOf(rs) {
		c := chart{title: b + ": handover p50 vs waiters", xlabel: "waiters", ylabel: "handover p50 (ms)", logX: true, logY: true}
		for _, im := range implsOf(rs, b) {
			s := series{name: im}
			for _, r := range rs {
				if r.Backend == b && r.Implementation == im {
					s.pts = append(s.pts, [2]float64{toF(r.Params["waiters"]), r.P50us / 1000})
				}
			}
			c.series = append(c.series, s)
		}
		name, err := rw.writeChart(c, "handover-"+b+".svg")
		if err != nil {
			return err
		}
		w("![%s](%s)\n", c.title, rw.rel(name))
	}
	w("\n")
	return nil
}

// throughput writes the throughput section (W3) and its charts, one per
// backend.
func (rw *reportWriter) throughput(rs []Row) error {
	w := rw.w
	w("## Throughput (W3)\n\n")
	w("K keys, C goroutines of one process (one client each library's way: fenced and the Redis libraries share one\n")
	w("client; etcd's Mutex needs a session per goroutine). Each goroutine loops: pick a key at random, acquire (waiting),\n")
	w("release, with no work inside. Implementations alternate windows; ops/s counts the acquisitions completed in the\n")
	w("windows, latency is the acquire call's.\n\n")
	w("| backend | K | C | implementation | ops/s | acquire p50 µs | acquire p99 µs | requests/op | ratio ops/s | ratio p99 |\n" +
		"| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range rs {
		w("| %s | %v | %v | %s | %s | %s | %s | %s | %s | %s |\n", r.Backend, r.Params["keys"], r.Params["clients"], r.Implementation,
			num(r.OpsPerSec), num(r.P50us), num(r.P99us), reqs(r.RequestsPerOp),
			ratioCell(r, rs, sameParams, func(r Row) float64 { return r.OpsPerSec }, true),
			ratioCell(r, rs, sameParams, func(r Row) float64 { return r.P99us }, false))
	}
	w("\n")
	for _, b := range backendsOf(rs) {
		c := chart{title: b + ": throughput vs clients (one line per implementation and K)", xlabel: "clients (C)", ylabel: "ops/s",
			logX: true, logY: true}
		for _, im := range implsOf(rs, b) {
			for ki, k := range distinct(rs, b, "keys") {
				s := series{name: fmt.Sprintf("%s K=%v", im, k), dash: ki}
				for _, r := range rs {
					if r.Backend == b && r.Implementation == im && toF(r.Params["keys"]) == k {
						s.pts = append(s.pts, [2]float64{toF(r.Params["clients"]), r.OpsPerSec})
					}
				}
				s.group = im
				c.series = append(c.series, s)
			}
		}
		name, err := rw.writeChart(c, "throughput-"+b+".svg")
		if err != nil {
			return err
		}
		w("![%s](%s)\n", c.title, rw.rel(name))
	}
	w("\n")
	return nil
}

// renewal writes the renewal section (W4), its losses and its chart.
func (rw *reportWriter) renewal(rs []Row) error {
	w := rw.w
	w("## Renewal at scale (W4)\n\n")
	w("One process holds M leases (acquired 64 at a time) for several renewal periods (TTL/3). Server calls per period are\n")
	w("counted by the server; CPU is the client process's (getrusage, user+system) per second of wall time; heap per lease\n")
	w("and goroutines are the growth over the process before it took the leases (after a GC). The incumbents do not renew\n")
	w("by themselves: redsync and redislock get the loop a user writes (one Extend/Refresh per lock per period, 64 in\n")
	w("flight); etcd's Mutex and go-zookeeper's Lock ride on one session.\n\n")
	w("| backend | implementation | M | TTL s | server calls/period | per lease | CPU s/s | heap B/lease | goroutines | lost | acquire " +
		"all s |\n| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range rs {
		calls, per := "—", "—"
		if r.ServerCallsPerPeriod > 0 || r.RequestsPerOp > 0 {
			calls, per = num(r.ServerCallsPerPeriod), fmt.Sprintf("%.4f", r.RequestsPerOp)
		}
		lost := "—"
		if r.LeasesLost != nil {
			lost = fmt.Sprint(*r.LeasesLost)
		}
		w("| %s | %s | %v | %.0f | %s | %s | %.3f | %s | %d | %s | %.1f |\n", r.Backend, r.Implementation, r.Params["leases"],
			toF(r.Params["ttl_ms"])/1000, calls, per, r.CPUSecondsPerSecond, num(r.HeapBytesPerLease), r.Goroutines, lost,
			r.AcquireAllSeconds)
	}
	w("\n")
	for _, r := range rs {
		if r.LeasesLost != nil && *r.LeasesLost > 0 {
			w("- **%s %s, M = %v: %d of %v leases lost.** One cause: %s\n", r.Backend, r.Implementation, r.Params["leases"], *r.LeasesLost,
				r.Params["leases"], cmp.Or(r.LossCause, "not reported"))
		}
	}
	w("\n")
	c := chart{title: "server calls per renewal period vs leases held", xlabel: "leases held (M)", ylabel: "server calls per period",
		logX: true, logY: true}
	for _, b := range backendsOf(rs) {
		for _, im := range implsOf(rs, b) {
			s := series{name: b + " " + im}
			for _, r := range rs {
				if r.Backend == b && r.Implementation == im && r.ServerCallsPerPeriod > 0 {
					s.pts = append(s.pts, [2]float64{toF(r.Params["leases"]), r.ServerCallsPerPeriod})
				}
			}
			if len(s.pts) > 0 {
				c.series = append(c.series, s)
			}
		}
	}
	if len(c.series) > 0 {
		name, err := rw.writeChart(c, "renewal.svg")
		if err != nil {
			return err
		}
		w("![%s](%s)\n\n", c.title, rw.rel(name))
	}
	return nil
}

// failures lists the measurements that did not complete, if any.
func (rw *reportWriter) failures(rows []Row) {
	var errs []Row
	for _, r := range rows {
		if r.Error != "" {
			errs = append(errs, r)
		}
	}
	if len(errs) == 0 {
		return
	}
	w := rw.w
	w("## Failures\n\nThese measurements did not complete; their figures above are missing or partial.\n\n")
	w("| workload | backend | implementation | params | error |\n| --- | --- | --- | --- | --- |\n")
	for _, r := range errs {
		w("| %s | %s | %s | %v | %s |\n", r.Workload, r.Backend, r.Implementation, r.Params, strings.ReplaceAll(r.Error, "|", "\\|"))
	}
	w("\n")
}

// isIncumbent says whether an implementation is another library (not
// fenced's).
func isIncumbent(name string) bool { return !strings.HasPrefix(name, "fenced") }

func sameParams(a, b Row) bool {
	if a.Backend != b.Backend || len(a.Params) != len(b.Params) {
		return false
	}
	for k, v := range a.Params {
		if fmt.Sprint(b.Params[k]) != fmt.Sprint(v) {
			return false
		}
	}
	return true
}

// ratioCell is, on fenced's row, its figure ÷ the best incumbent's in the
// same cell (higher is better when higherBetter), naming that incumbent.
func ratioCell(r Row, rs []Row, same func(a, b Row) bool, f func(Row) float64, higherBetter bool) string {
	if r.Implementation != "fenced" || f(r) == 0 {
		return ""
	}
	best, bestName := 0.0, ""
	for _, o := range rs {
		if !isIncumbent(o.Implementation) || !same(r, o) || f(o) == 0 {
			continue
		}
		if best == 0 || (higherBetter && f(o) > best) || (!higherBetter && f(o) < best) {
			best, bestName = f(o), o.Implementation
		}
	}
	if best == 0 {
		return ""
	}
	return fmt.Sprintf("%.2f× (%s)", f(r)/best, bestName)
}

func find(rs []Row, backend, impl string) (Row, bool) {
	for _, r := range rs {
		if r.Backend == backend && r.Implementation == impl {
			return r, true
		}
	}
	return Row{}, false
}

func backendsOf(rs []Row) []string {
	var out []string
	for _, r := range rs {
		if !slices.Contains(out, r.Backend) {
			out = append(out, r.Backend)
		}
	}
	return out
}

func implsOf(rs []Row, backend string) []string {
	var out []string
	for _, r := range rs {
		if r.Backend == backend && !slices.Contains(out, r.Implementation) {
			out = append(out, r.Implementation)
		}
	}
	return out
}

func distinct(rs []Row, backend, param string) []float64 {
	var out []float64
	for _, r := range rs {
		if v := toF(r.Params[param]); r.Backend == backend && !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	slices.Sort(out)
	return out
}

// toF reads a JSON number param (float64 after a round trip, int before).
func toF(v any) float64 {
	switch x := v.(type) {
	case float64:
		return x
	case int:
		return float64(x)
	case int64:
		return float64(x)
	}
	return math.NaN()
}

// num formats a figure with 3 significant digits and thousands spaces.
func num(v float64) string {
	switch {
	case v == 0:
		return "—"
	case math.Abs(v) >= 1000:
		s := fmt.Sprintf("%.0f", v)
		var b strings.Builder
		for i, c := range s {
			if i > 0 && (len(s)-i)%3 == 0 && s[i-1] != '-' {
				b.WriteString(" ")
			}
			b.WriteRune(c)
		}
		return b.String()
	case math.Abs(v) >= 100:
		return fmt.Sprintf("%.0f", v)
	case math.Abs(v) >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

func reqs(v float64) string {
	if v == 0 {
		return "—"
	}
	return num(v)
}
