// Command suite runs fenced's benchmarks side by side with the libraries
// people use today (redsync, redislock, etcd's concurrency.Mutex,
// go-zookeeper's Lock) against real servers it starts itself, writes the
// raw figures as JSON under bench/results/ and renders docs/benchmarks.md.
// Run it through ./scripts/bench.sh [--quick] [--only redis,etcd,...].
//
// Every comparison interleaves the implementations: a workload runs in
// rounds, each implementation once per round in a fresh random order,
// and the first round (the warm-up) is discarded, so that noise from the
// rest of the machine hits them alike.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// backend is one store with the implementations measured on it.
type backend struct {
	name string
	// impls are the implementations of the op workloads, fenced first.
	impls []impl
	// holders are the implementations of the renewal workload; none: it
	// is not run on this backend.
	holders []holderImpl
	// count counts server-side requests in the op workloads;
	// renewalCount in the renewal workload. nil: not counted.
	count, renewalCount counter
	// renewalTTL is the lease TTL of the renewal workload with m leases.
	renewalTTL func(m int) time.Duration
	// note describes the setup, for the report.
	note string
	// spawn opens impls in child processes (the handover workload's
	// waiters); unset: they run as clients of the suite's process.
	spawn spawnSpec
}

// backends are the stores in the order they run, with their starters.
var backends = []struct {
	name  string
	start func(tb *testenv.MainTB) *backend
}{
	{"redis", redisBackend},
	{"redis-aof", redisAOFBackend},
	{"redlock", redlockBackend},
	{"etcd", etcdBackend},
	{"zookeeper", zookeeperBackend},
	{"postgres", postgresBackend},
	{"mysql", mysqlBackend},
	{"sqlite", sqliteBackend},
}

var allWorkloads = []string{"uncontended", "handover", "throughput", "renewal"}

// suite is one run: its configuration and the rows measured so far.
type suite struct {
	cfg     config
	results Results
	out     string // the JSON file, rewritten after every backend
}

func (s *suite) add(r Row) {
	s.results.Rows = append(s.results.Rows, r)
	line := fmt.Sprintf("%-11s %-9s %-13s %v", r.Workload, r.Backend, r.Implementation, r.Params)
	switch {
	case r.Error != "":
		line += " ERROR " + r.Error
	case r.Workload == "renewal":
		line += fmt.Sprintf(" calls/period=%.0f cpu=%.3fs/s heap/lease=%.0fB goroutines=%d lost=%d acquire-all=%.1fs",
			r.ServerCallsPerPeriod, r.CPUSecondsPerSecond, r.HeapBytesPerLease, r.Goroutines, *r.LeasesLost, r.AcquireAllSeconds)
	default:
		line += fmt.Sprintf(" p50=%.0fµs p99=%.0fµs ops/s=%.0f req/op=%.2f n=%d", r.P50us, r.P99us, r.OpsPerSec, r.RequestsPerOp, r.Samples)
	}
	log.Print(line)
}

func (s *suite) save() {
	s.results.Seconds = time.Since(started).Seconds()
	b, err := json.MarshalIndent(s.results, "", "  ")
	if err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(s.out, append(b, '\n'), 0o644); err != nil {
		log.Fatal(err)
	}
}

var started = time.Now()

// running is the MainTB of the backend being measured, whose servers an
// interrupt stops.
var running atomic.Pointer[testenv.MainTB]

// stopOnSignal stops the servers of the backend being measured and exits
// when the run is interrupted, so that no server outlives it.
func stopOnSignal() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		sig := <-ch
		log.Printf("%v: stopping the servers", sig)
		if tb := running.Load(); tb != nil {
			tb.Close()
		}
		os.Exit(130)
	}()
}

// fullReport is the published report, rendered by a run of every backend
// and workload; partialReport (not in git) is where a run of some of them
// goes unless -docs names a file.
const (
	fullReport    = "docs/benchmarks.md"
	partialReport = "docs/benchmarks-partial.md"
)

// parseCounts parses a comma-separated list of positive integers.
func parseCounts(list string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a positive whole number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// flagSet reports whether the command line set the flag name.
func flagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func main() {
	if len(os.Args) == 3 && os.Args[1] == childFlag {
		if err := runChild(os.Args[2]); err != nil {
			fmt.Fprintln(os.Stderr, "suite child:", err)
			os.Exit(1)
		}
		return
	}
	quick := flag.Bool("quick", false,
		"smaller runs (about 5 minutes on 2 cores); renewal with 10 000 leases instead of 10 000 and 100 000")
	only := flag.String("only", "", "comma-separated backends (default all): "+backendNames())
	workloads := flag.String("workloads", strings.Join(allWorkloads, ","), "comma-separated workloads")
	resultsDir := flag.String("results", "bench/results", "directory of the JSON results")
	docs := flag.String("docs", fullReport,
		"report to render (its SVG charts go in the directory of its name without .md); "+
			"a run of some backends or workloads renders "+partialReport+" unless -docs is given")
	render := flag.String("render", "", "only render the report from this results file")
	command := flag.String("command", "", "the command line to print in the report")
	leases := flag.String("leases", "",
		"comma-separated numbers of leases held in the renewal workload (default 10000 with -quick, 10000,100000 without)")
	cpuProfile := flag.String("cpuprofile", "",
		"write the suite process's CPU profile (the in-process workloads: uncontended, throughput, renewal) to this file")
	childProfiles := flag.String("childprofiles", "",
		"write each child process's CPU profile (the handover workload's waiters) to this directory, one file per process")
	flag.Parse()
	log.SetFlags(log.Ltime)
	if *childProfiles != "" {
		if err := os.MkdirAll(*childProfiles, 0o755); err != nil {
			log.Fatal(err)
		}
		// Children learn it from their environment (see runChild).
		os.Setenv(childProfileEnv, *childProfiles)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			log.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	if *render != "" {
		var res Results
		b, err := os.ReadFile(*render)
		if err == nil {
			err = json.Unmarshal(b, &res)
		}
		if err == nil {
			err = renderReport(res, *render, *docs)
		}
		if err != nil {
			log.Fatal(err)
		}
		return
	}
	selected, err := pick(*only, backendNames())
	if err != nil {
		log.Fatal(err)
	}
	wls, err := pick(*workloads, strings.Join(allWorkloads, ","))
	if err != nil {
		log.Fatal(err)
	}
	if partial := len(selected) < len(backends) || len(wls) < len(allWorkloads); partial && !flagSet("docs") {
		// The published report covers every backend and workload; a
		// partial run must not replace it with its own few rows.
		*docs = partialReport
	}
	s := &suite{cfg: fullConfig}
	if *quick {
		s.cfg = quickConfig
	}
	if *leases != "" {
		if s.cfg.renewalM, err = parseCounts(*leases); err != nil {
			log.Fatalf("-leases: %v", err)
		}
	}
	s.results = Results{Date: started.UTC().Format(time.RFC3339), Machine: machine(), Command: *command, Quick: *quick}
	if *quick {
		s.results.Notes = append(s.results.Notes,
			fmt.Sprintf("--quick: renewal with M = %v leases; throughput only on %s; shorter windows and fewer rounds than the full run",
				s.cfg.renewalM, strings.Join(s.cfg.throughputOn, ", ")))
	}
	if err := os.MkdirAll(*resultsDir, 0o755); err != nil {
		log.Fatal(err)
	}
	mode := "full"
	if *quick {
		mode = "quick"
	}
	s.out = filepath.Join(*resultsDir, started.UTC().Format("2006-01-02T15-04-05Z")+"-"+mode+".json")
	stopOnSignal()
	ctx := context.Background()
	for _, b := range backends {
		if !slices.Contains(selected, b.name) {
			continue
		}
		s.runBackend(ctx, b.name, b.start, wls)
		s.save()
	}
	s.save()
	log.Printf("wrote %s (%.0fs)", s.out, s.results.Seconds)
	if err := renderReport(s.results, s.out, *docs); err != nil {
		log.Fatal(err)
	}
	log.Printf("wrote %s", *docs)
}

// runBackend starts the backend's servers, runs the workloads and stops
// the servers.
func (s *suite) runBackend(ctx context.Context, name string, start func(*testenv.MainTB) *backend, workloads []string) {
	tb := testenv.NewMainTB()
	running.Store(tb)
	defer tb.Close()
	t0 := time.Now()
	log.Printf("%s: starting servers", name)
	b := start(tb)
	if b.note != "" {
		s.results.Notes = append(s.results.Notes, name+": "+b.note)
	}
	for _, w := range workloads {
		t := time.Now()
		switch w {
		case "uncontended":
			s.uncontended(ctx, b)
		case "handover":
			s.handover(ctx, b)
		case "throughput":
			s.throughput(ctx, b)
		case "renewal":
			if len(b.holders) > 0 {
				s.renewal(ctx, b)
			}
		}
		log.Printf("%s %s: %.0fs", name, w, time.Since(t).Seconds())
	}
	log.Printf("%s: %.0fs", name, time.Since(t0).Seconds())
}

func backendNames() string {
	var ns []string
	for _, b := range backends {
		ns = append(ns, b.name)
	}
	return strings.Join(ns, ",")
}

// pick splits a comma-separated list and checks each name is known; an
// empty list is all of them.
func pick(list, known string) ([]string, error) {
	all := strings.Split(known, ",")
	if strings.TrimSpace(list) == "" {
		return all, nil
	}
	var out []string
	for _, n := range strings.Split(list, ",") {
		n = strings.TrimSpace(n)
		if !slices.Contains(all, n) {
			return nil, fmt.Errorf("unknown name %q: want some of %s", n, known)
		}
		out = append(out, n)
	}
	return out, nil
}

// machine describes the host: CPU model, cores, OS, Go version.
func machine() string {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "model name"); ok {
				model = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	return fmt.Sprintf("%s, %d cores, %s/%s, %s", model, runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version())
}
