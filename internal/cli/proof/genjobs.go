package proof

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fenced-dev/fenced"
)

// GenJobsConfig describes one generative run of the scheduler adapters
// (RunGenJobs).
type GenJobsConfig struct {
	// Store is the authority's URL; MinFence the weakest fence the runs'
	// leases accept.
	Store    string
	MinFence fenced.FenceStrength
	// Seed draws the nemesis's schedule.
	Seed uint64
	// PerKind (default 3) scheduler processes of each kind: gocron
	// (fencedgocron.Locker) and robfig/cron (fencedcron.SkipIfHeld), each
	// kind running its own job.
	PerKind int
	// TTL of the leases (default 1s); Duration of the churn (default 40s).
	TTL, Duration time.Duration
	// Hazard (test only): the jobs ignore their lease's context and
	// write without the guard.
	Hazard bool
	// Command starts a scheduler (a binary that calls MaybeRunWorker
	// first).
	Command func() *exec.Cmd
	Dir     string
	Logf    func(format string, args ...any)
}

// jobFault is one fault the nemesis applied, on the controller's
// CLOCK_MONOTONIC (Now).
type jobFault struct {
	Kind     string // kill, stop, leave, break
	Slot     int
	PID      int
	Fence    uint64 // the lease broken (break)
	From, To int64
}

// genJobsRun is one jobs run's controller.
type genJobsRun struct {
	cfg   GenJobsConfig
	jobs  [2]string // the gocron job's name, the cron job's
	admin *fenced.Client
	res   *jobResource
	rng   *rand.Rand
	slots

	mu          sync.Mutex
	faults      []jobFault
	longestStop time.Duration
}

// kind returns slot i's scheduler kind and job.
func (r *genJobsRun) kind(i int) (string, string) {
	if i < r.cfg.PerKind {
		return schedGocron, r.jobs[0]
	}
	return schedCron, r.jobs[1]
}

// RunGenJobs runs PerKind gocron schedulers (fencedgocron.Locker, a job
// made with Locker.Task) as separate processes on Store. It also runs
// PerKind robfig/cron schedulers (fencedcron.SkipIfHeld, a
// fencedcron.LeaseFunc job). Each kind has its own job due every second.
// Meanwhile a nemesis drawn from Seed strikes one fault at a time. It kills
// a scheduler (-9, started again within a TTL). Or it stops one (SIGSTOP
// for 1.5 to 3 TTLs, then SIGCONT). Or it makes one leave (SIGTERM: the
// scheduler shuts down; started again within half a TTL). Or it breaks a
// job's lease (Client.Break). Or, on a SQLite store, it stalls the store.
// The controller then holds the store file's write lock for 1.5 to 3 TTLs,
// as a process stopped inside a write of it does. So the holder's renewals
// fail and its lease expires while its process runs. A scheduler that exits
// by itself is a failure, and is started again. CheckGenJobs judges the
// run.
func RunGenJobs(ctx context.Context, cfg GenJobsConfig) (GenJobsReport, error) {
	if cfg.PerKind == 0 {
		cfg.PerKind = 3
	}
	if cfg.TTL == 0 {
		cfg.TTL = time.Second
	}
	if cfg.Duration == 0 {
		cfg.Duration = 40 * time.Second
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	if cfg.Command == nil {
		return GenJobsReport{}, errors.New("proof: GenJobsConfig.Command is nil")
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return GenJobsReport{}, err
	}
	res, err := openJobResource(filepath.Join(cfg.Dir, genJobsResource))
	if err != nil {
		return GenJobsReport{}, err
	}
	defer res.db.Close()
	ac, err := fenced.Open(ctx, cfg.Store, nil)
	if err != nil {
		return GenJobsReport{}, err
	}
	defer ac.Close()
	stamp := time.Now().UnixNano()
	r := &genJobsRun{
		cfg:   cfg,
		jobs:  [2]string{fmt.Sprintf("genjobs-gocron-%d-%d", cfg.Seed, stamp), fmt.Sprintf("genjobs-cron-%d-%d", cfg.Seed, stamp)},
		admin: ac,
		res:   res,
		rng:   rand.New(rand.NewPCG(cfg.Seed, 1<<43)), slots: newSlots(cfg.Dir, 2*cfg.PerKind, "scheduler", cfg.Seed, cfg.Logf),
	}
	r.restart = r.startSched
	if err := res.setup(ctx, r.jobs[:]); err != nil {
		return GenJobsReport{}, err
	}
	started := time.Now()
	for i := range 2 * cfg.PerKind {
		if err := r.startSched(i); err != nil {
			r.stopAll()
			return GenJobsReport{}, err
		}
	}
	dctx, stopDelay := context.WithCancel(ctx)
	delay := &partObserver{}
	done := make(chan struct{})
	go func() { defer close(done); delay.measureDelay(dctx) }()
	churnFrom := Now()
	nemErr := r.nemesis(ctx)
	churnTo := Now()
	stopDelay()
	<-done
	r.stopAll()
	writes, err := res.writes(ctx)
	if err != nil {
		return GenJobsReport{}, err
	}
	events, err := readJobHistory(filepath.Join(cfg.Dir, genJobsHistory))
	if err != nil {
		return GenJobsReport{}, err
	}
	r.mu.Lock()
	faults, stall := r.faults, time.Duration(0)
	if b, err := json.Marshal(faults); err == nil { // for a look at a failed run
		os.WriteFile(filepath.Join(cfg.Dir, "jobs-faults.json"), b, 0o644)
	}
	// A scheduler stopped inside a write of a SQLite store or resource
	// holds the file's write lock for its whole stop, stalling every
	// other scheduler: the longest stop is part of the liveness bound.
	stall = r.longestStop
	rep := GenJobsReport{Exits: r.exitCounts()}
	r.mu.Unlock()
	delay.mu.Lock()
	sched := delay.maxDelay
	delay.mu.Unlock()
	rep = CheckGenJobs(events, writes, faults, genJobsLiveness{From: churnFrom, To: churnTo, TTL: cfg.TTL, Delay: sched, Stall: stall},
		rep.Exits)
	rep.Seed, rep.Duration = cfg.Seed, time.Since(started).Round(time.Second)
	return rep, nemErr
}

// startSched starts slot i.
func (r *genJobsRun) startSched(i int) error {
	kind, job := r.kind(i)
	r.started(i)
	sc := GenJobsSchedConfig{Slot: i, Kind: kind, Job: job, Store: r.cfg.Store, TTL: r.cfg.TTL, MinFence: r.cfg.MinFence, Dir: r.cfg.Dir,
		Hazard: r.cfg.Hazard}
	raw, err := json.Marshal(sc)
	if err != nil {
		return err
	}
	cmd := r.cfg.Command()
	cmd.Env = append(os.Environ(), envGenJobs+"="+string(raw))
	return r.start(i, cmd, nil)
}

func (r *genJobsRun) fault(f jobFault) {
	r.mu.Lock()
	r.faults = append(r.faults, f)
	r.mu.Unlock()
}

// nemesis injects faults drawn from the seed until the Duration is over:
// a pause of 0.3 to 1.5 TTLs, then one of kill, stop, leave, break or
// stall (see RunGenJobs).
func (r *genJobsRun) nemesis(ctx context.Context) error {
	ttl := r.cfg.TTL
	between := func(lo, hi float64) time.Duration {
		return time.Duration((lo + r.rng.Float64()*(hi-lo)) * float64(ttl))
	}
	start := time.Now()
	if err := r.sleep(ctx, 2*ttl); err != nil { // let the schedulers start
		return err
	}
	// The kinds are drawn from a shuffled bag, refilled when empty, so
	// that every kind comes within the first round (9 faults).
	var bag []string
	for r.goOn(ctx, start) {
		if err := r.sleep(ctx, between(0.3, 1.5)); err != nil {
			return err
		}
		w := r.rng.IntN(2 * r.cfg.PerKind)
		if len(bag) == 0 {
			bag = []string{"kill", "kill", "stop", "stop", "leave", "break", "break", "stall", "stall"}
			if networked(r.cfg.Store) {
				bag = bag[:7]
			}
			r.rng.Shuffle(len(bag), func(i, j int) { bag[i], bag[j] = bag[j], bag[i] })
		}
		kind := bag[0]
		bag = bag[1:]
		cmd, _ := r.worker(w) // the break's target is w's job
		f := jobFault{Kind: kind, Slot: w, PID: cmd.Process.Pid, From: Now()}
		r.hold(w, true)
		switch kind {
		case "kill", "leave":
			r.cfg.Logf("seed %d: %s scheduler %d", r.cfg.Seed, kind, w)
			r.end(w, kind == "kill")
			f.To = Now()
			r.fault(f)
			lo := between(0, 1)
			if kind == "leave" {
				lo /= 2
			}
			if err := r.sleep(ctx, lo); err != nil {
				return err
			}
			if err := r.startSched(w); err != nil {
				return err
			}
		case "stop":
			d := between(1.5, 3)
			r.mu.Lock()
			r.longestStop = max(r.longestStop, d)
			r.mu.Unlock()
			r.cfg.Logf("seed %d: stop scheduler %d for %v", r.cfg.Seed, w, d.Round(time.Millisecond))
			cmd.Process.Signal(syscall.SIGSTOP)
			err := r.sleep(ctx, d)
			cmd.Process.Signal(syscall.SIGCONT)
			f.To = Now()
			r.fault(f)
			if err != nil {
				return err
			}
		case "stall":
			d := between(1.5, 3)
			r.mu.Lock()
			r.longestStop = max(r.longestStop, d)
			r.mu.Unlock()
			f.PID = 0
			if err := r.stall(ctx, d, &f); err != nil {
				return err
			}
			r.fault(f)
		case "break":
			// The job's lease is held about half of each interval: try
			// every 10-60ms for up to two intervals, so that the break
			// lands in a run.
			kind, job := r.kind(w)
			var info fenced.LeaseInfo
			var err error
			for until := time.Now().Add(2 * genJobsInterval); ; {
				bctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				info, err = r.admin.Break(bctx, genJobKey(kind, job), "the generative jobs proof", "proof")
				cancel()
				if !errors.Is(err, fenced.ErrNotHeld) || time.Now().After(until) {
					break
				}
				if err := r.sleep(ctx, time.Duration(10+r.rng.IntN(50))*time.Millisecond); err != nil {
					return err
				}
			}
			if err == nil {
				f.PID, f.Fence, f.To = 0, info.Fence, Now()
				r.fault(f)
				r.cfg.Logf("seed %d: break %s fence %d", r.cfg.Seed, job, info.Fence)
			} else {
				r.cfg.Logf("seed %d: break %s: %v", r.cfg.Seed, job, err)
			}
		}
		r.hold(w, false)
	}
	return r.sleep(ctx, 2*ttl) // let the last fault settle
}

// goOn reports whether the nemesis strikes again: within the Duration from
// start, and past it (up to 3 × Duration) until each job ran
// GenJobsMinTicks ticks. A starved machine's schedulers, started again
// after each kill, run fewer in the same Duration.
func (r *genJobsRun) goOn(ctx context.Context, start time.Time) bool {
	d := time.Since(start)
	return d < r.cfg.Duration || !r.enough(ctx) && d < 3*r.cfg.Duration
}

// GenJobsMinTicks is how many ticks each job of a run runs at least, if
// 3 × Duration allows: a run with fewer says little by its zeros.
const GenJobsMinTicks = 10

// enough reports whether each job has run GenJobsMinTicks ticks.
func (r *genJobsRun) enough(ctx context.Context) bool {
	ticks, err := r.res.ticks(ctx)
	if err != nil {
		return false // a busy resource: look again after the next fault
	}
	return ticks[schedGocron] >= GenJobsMinTicks && ticks[schedCron] >= GenJobsMinTicks
}

// stall holds the SQLite store's write lock for d (BEGIN IMMEDIATE, then
// ROLLBACK), noting in f when it held it.
func (r *genJobsRun) stall(ctx context.Context, d time.Duration, f *jobFault) error {
	path, _, _ := strings.Cut(strings.TrimPrefix(r.cfg.Store, "sqlite://"), "?")
	db, err := sql.Open("sqlite", "file:"+(&url.URL{Path: path}).EscapedPath()+"?_pragma=busy_timeout(30000)")
	if err != nil {
		return fmt.Errorf("proof: stall the store: %w", err)
	}
	defer db.Close()
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("proof: stall the store: %w", err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return fmt.Errorf("proof: stall the store: %w", err)
	}
	f.From = Now()
	r.cfg.Logf("seed %d: stall the store for %v", r.cfg.Seed, d.Round(time.Millisecond))
	err = r.sleep(ctx, d)
	if _, rerr := conn.ExecContext(context.Background(), "ROLLBACK"); rerr != nil && err == nil {
		err = fmt.Errorf("proof: end the store's stall: %w", rerr)
	}
	f.To = Now()
	return err
}
