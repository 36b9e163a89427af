package proof

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/robfig/cron/v3"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fence"
	"github.com/fenced-dev/fenced/fencedcron"
	"github.com/fenced-dev/fenced/fencedgocron"
)

// The scheduler process of the generative jobs proof (RunGenJobs): a
// gocron scheduler with fencedgocron's Locker and a job made with
// Locker.Task, or a robfig/cron scheduler with fencedcron.SkipIfHeld and a
// fencedcron.LeaseFunc job, as users run them. The job is due every second
// (cron "* * * * * *", on the second). Each run writes the resource a few
// times, guarded by its lease's fence, and logs (scheduler, tick, fence,
// pid, CLOCK_MONOTONIC instants, whether its context was live).

// envGenJobs carries a scheduler's GenJobsSchedConfig, as JSON.
const envGenJobs = "FENCED_PROOF_GENJOBS"

// Files of a jobs run, in its directory.
const (
	genJobsHistory  = "jobs-history.jsonl"
	genJobsResource = "jobs-resource.db"
)

// Scheduler kinds.
const (
	schedGocron = "gocron"
	schedCron   = "cron"
)

// genJobsInterval is the job's schedule: every second, on the second.
const genJobsInterval = time.Second

// genJobsMinHold is the runs' minimum hold: both adapters' default
// (fencedcron.DefaultMinHold is the same).
const genJobsMinHold = fencedgocron.DefaultMinHold

// genJobWrites and genJobWriteEvery shape a run: this many guarded writes,
// this far apart (about 0.3 s of work in a 1 s interval); one run in four
// writes for 1.5 to 2.5 TTLs instead.
const (
	genJobWrites     = 6
	genJobWriteEvery = 50 * time.Millisecond
)

// GenJobsSchedConfig is what one scheduler process needs.
type GenJobsSchedConfig struct {
	Slot  int    `json:"slot"`
	Kind  string `json:"kind"` // schedGocron or schedCron
	Job   string `json:"job"`  // the job's name; its lease key is genJobKey(Kind, Job)
	Store string `json:"store"`
	// TTL of the runs' leases; their MinHold is the adapters' default.
	TTL      time.Duration        `json:"ttl"`
	MinFence fenced.FenceStrength `json:"min_fence"`
	Dir      string               `json:"dir"`
	// Hazard (test only) makes the job ignore its lease's context and
	// write without the guard, to show the checker finds what follows.
	Hazard bool `json:"hazard,omitempty"`
}

// genJobKey is the lease key of job name under scheduler kind: the
// Locker's key for gocron, the same shape for cron.
func genJobKey(kind, name string) string {
	if kind == schedGocron {
		return fencedgocron.DefaultKeyPrefix + name
	}
	return "cron:" + name
}

// jobEvent is one line of a jobs run's history (genJobsHistory).
type jobEvent struct {
	// K is "start" (a run began under its lease), "first" (its first
	// accepted write committed), "end" (it returned).
	K     string `json:"k"`
	T     int64  `json:"t"` // CLOCK_MONOTONIC (Now)
	Slot  int    `json:"slot"`
	PID   int    `json:"pid"`
	Kind  string `json:"kind"`
	Job   string `json:"job"`
	Fence uint64 `json:"f"`
	// Tick is the schedule slot of the run (Unix seconds of its start);
	// Late how far into the slot it started ("start").
	Tick int64         `json:"tick,omitempty"`
	Late time.Duration `json:"late,omitempty"`
	// Live is the last instant (Now) the run saw its context live
	// ("end").
	Live    int64 `json:"live,omitempty"`
	Refused int   `json:"refused,omitempty"`
	// Lost is the lease's error when it ended before the run returned
	// ("end").
	Lost string `json:"lost,omitempty"`
	Err  string `json:"err,omitempty"`
}

// jobResource is a jobs run's resource: a SQLite file whose table job has
// a row per job, guarded by fence.SQL, and jobs_log one row per accepted
// write, in commit order.
type jobResource struct {
	db    *sql.DB
	guard *fence.SQL
}

func openJobResource(path string) (*jobResource, error) {
	dsn := "file:" + (&url.URL{Path: path}).EscapedPath() + "?" + url.Values{
		"_pragma": {"busy_timeout(30000)", "journal_mode(WAL)", "synchronous(NORMAL)"},
		"_txlock": {"immediate"},
	}.Encode()
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("proof: open resource: %w", err)
	}
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(0) // no connection of a stopped scheduler holds a lock
	g, err := fence.NewSQL(db, fence.SQLite, fence.Table{Name: "job", Key: "k"}, nil)
	if err != nil {
		db.Close()
		return nil, err
	}
	return &jobResource{db: db, guard: g}, nil
}

// setup creates the tables and a row for each job.
func (r *jobResource) setup(ctx context.Context, jobs []string) error {
	for _, s := range []string{
		`CREATE TABLE IF NOT EXISTS job (k TEXT PRIMARY KEY, n INTEGER NOT NULL DEFAULT 0)`,
		`CREATE TABLE IF NOT EXISTS jobs_log (seq INTEGER PRIMARY KEY AUTOINCREMENT, job TEXT NOT NULL, kind TEXT NOT NULL, ` +
			`fence INTEGER NOT NULL, pid INTEGER NOT NULL, tick INTEGER NOT NULL, t INTEGER NOT NULL, live INTEGER NOT NULL)`,
	} {
		if _, err := r.db.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("proof: set up resource: %w", err)
		}
	}
	if err := r.guard.EnsureColumns(ctx); err != nil {
		return err
	}
	for _, j := range jobs {
		if _, err := r.db.ExecContext(ctx, `INSERT OR IGNORE INTO job (k) VALUES (?)`, j); err != nil {
			return fmt.Errorf("proof: set up resource: %w", err)
		}
	}
	return nil
}

// jobWrite is one accepted write, as jobs_log holds it.
type jobWrite struct {
	Seq, PID  int64
	Job, Kind string
	Fence     uint64
	Tick, T   int64
	Live      bool
}

// write makes one write of a run: the job's row, guarded by t (unguarded
// when hazard), and a jobs_log row, in one transaction. It reports whether
// the write was accepted.
func (r *jobResource) write(ctx context.Context, w jobWrite, t fence.Token, hazard bool) (bool, error) {
	tx, err := r.db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback()
	if hazard {
		if _, err := tx.ExecContext(ctx, `UPDATE job SET n = n + 1 WHERE k = ?`, w.Job); err != nil {
			return false, err
		}
	} else {
		res, err := r.guard.Update(ctx, tx, w.Job, t, fence.Write{Set: "n = n + 1"})
		if err != nil || !res.Applied() {
			return false, err
		}
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO jobs_log (job, kind, fence, pid, tick, t, live) VALUES (?, ?, ?, ?, ?, ?, ?)`,
		w.Job, w.Kind, int64(w.Fence), w.PID, w.Tick, w.T, boolInt(w.Live)); err != nil {
		return false, err
	}
	return true, tx.Commit()
}

// writes returns every accepted write, in commit order.
func (r *jobResource) writes(ctx context.Context) ([]jobWrite, error) {
	rows, err := r.db.QueryContext(ctx, `SELECT seq, job, kind, fence, pid, tick, t, live FROM jobs_log ORDER BY seq`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ws []jobWrite
	for rows.Next() {
		var w jobWrite
		var f, live int64
		if err := rows.Scan(&w.Seq, &w.Job, &w.Kind, &f, &w.PID, &w.Tick, &w.T, &live); err != nil {
			return nil, err
		}
		w.Fence, w.Live = uint64(f), live == 1
		ws = append(ws, w)
	}
	return ws, rows.Err()
}

// ticks returns how many ticks of each scheduler kind were written.
func (r *jobResource) ticks(ctx context.Context) (map[string]int, error) {
	rows, err := r.db.QueryContext(ctx, `SELECT kind, count(DISTINCT tick) FROM jobs_log GROUP BY kind`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var kind string
		var n int
		if err := rows.Scan(&kind, &n); err != nil {
			return nil, err
		}
		out[kind] = n
	}
	return out, rows.Err()
}

// jobRecorder appends jobEvents to the history file shared by the run's
// processes: one write(2) per line, O_APPEND.
type jobRecorder struct{ f *os.File }

func (r jobRecorder) record(e jobEvent) {
	if e.T == 0 {
		e.T = Now()
	}
	e.PID = os.Getpid()
	b, _ := json.Marshal(e)
	if _, err := r.f.Write(append(b, '\n')); err != nil {
		fmt.Fprintln(os.Stderr, "proof scheduler:", err)
		os.Exit(1)
	}
}

// genJob is the job one scheduler runs.
type genJob struct {
	cfg GenJobsSchedConfig
	rec jobRecorder
	res *jobResource
}

// run is one run of the job, under lease l, with ctx the run's context
// (it ends when the lease is lost): genJobWrites guarded writes, and one
// more once ctx has ended, so that the resource, not the run's belief,
// must refuse a stale one.
func (j *genJob) run(ctx context.Context, l *fenced.Lease) error {
	now := time.Now().UnixNano()
	tick := now / int64(genJobsInterval)
	ev := jobEvent{K: "start", Slot: j.cfg.Slot, Kind: j.cfg.Kind, Job: j.cfg.Job, Fence: l.Fence(), Tick: tick,
		Late: time.Duration(now % int64(genJobsInterval))}
	j.rec.record(ev)
	ev.Late = 0
	end := ev
	end.K, end.T = "end", 0
	defer func() {
		if err := l.Err(); err != nil {
			end.Lost = err.Error()
		}
		j.rec.record(end)
	}()
	if j.cfg.Hazard {
		ctx = context.Background() // the hazard: the run ignores its lease's context
	}
	tok := fence.From(l)
	pid := int64(os.Getpid())
	first := true
	n := genJobWrites
	if rand.IntN(4) == 0 {
		// One run in four is long: 1.5 to 2.5 TTLs, so that a lease
		// lost to a stalled store ends a run in progress.
		n = int((1.5 + rand.Float64()) * float64(j.cfg.TTL) / float64(genJobWriteEvery))
	}
	for k := 0; k < n; k++ {
		// Live at t: t is read before the look at the context, which
		// only ever goes from live to ended.
		t := Now()
		live := ctx.Err() == nil
		if live {
			end.Live = t
		}
		w := jobWrite{Job: j.cfg.Job, Kind: j.cfg.Kind, Fence: l.Fence(), PID: pid, Tick: tick, T: t, Live: live}
		wctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		ok, err := j.res.write(wctx, w, tok, j.cfg.Hazard)
		cancel()
		switch {
		case err != nil:
			end.Err = err.Error()
		case !ok:
			end.Refused++
		case first:
			first = false
			f := ev
			f.K, f.T = "first", 0 // after the commit
			j.rec.record(f)
		}
		if !live {
			return context.Cause(ctx)
		}
		select {
		case <-ctx.Done():
		case <-time.After(genJobWriteEvery):
		}
	}
	return nil
}

// runGenJobsSched runs one scheduler until SIGTERM, then shuts it down
// (its runs end, their leases are released) and exits 0.
func runGenJobsSched(cfg GenJobsSchedConfig) int {
	ctx := context.Background()
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "proof scheduler:", err)
		return 1
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	f, err := os.OpenFile(cfg.Dir+"/"+genJobsHistory, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fail(err)
	}
	res, err := openJobResource(cfg.Dir + "/" + genJobsResource)
	if err != nil {
		return fail(err)
	}
	c, err := fenced.Open(ctx, cfg.Store, &fenced.Options{MinBackoff: 5 * time.Millisecond, MaxBackoff: 100 * time.Millisecond})
	if err != nil {
		return fail(err)
	}
	defer c.Close()
	job := &genJob{cfg: cfg, rec: jobRecorder{f}, res: res}
	lease := fenced.LeaseOptions{TTL: cfg.TTL, MinFence: cfg.MinFence}
	onErr := func(err error) { fmt.Fprintf(os.Stderr, "proof scheduler %d: %v\n", cfg.Slot, err) }
	switch cfg.Kind {
	case schedGocron:
		lk, err := fencedgocron.NewLocker(c, &fencedgocron.Options{Lease: lease})
		if err != nil {
			return fail(err)
		}
		s, err := gocron.NewScheduler(gocron.WithDistributedLocker(lk))
		if err != nil {
			return fail(err)
		}
		if _, err := s.NewJob(gocron.CronJob("* * * * * *", true), lk.Task(job.run), gocron.WithName(cfg.Job)); err != nil {
			return fail(err)
		}
		s.Start()
		<-sigs
		if err := s.Shutdown(); err != nil {
			return fail(err)
		}
	case schedCron:
		skip, err := fencedcron.SkipIfHeld(c, genJobKey(cfg.Kind, cfg.Job), &fencedcron.Options{Lease: lease, OnError: onErr})
		if err != nil {
			return fail(err)
		}
		cr := cron.New(cron.WithSeconds(), cron.WithChain(skip))
		if _, err := cr.AddJob("* * * * * *", fencedcron.LeaseFunc(job.run)); err != nil {
			return fail(err)
		}
		cr.Start()
		<-sigs
		<-cr.Stop().Done()
	default:
		return fail(fmt.Errorf("unknown scheduler kind %q", cfg.Kind))
	}
	return 0
}

// maybeRunGenJobsSched runs a jobs scheduler and exits if this process was
// started as one.
func maybeRunGenJobsSched() {
	raw := os.Getenv(envGenJobs)
	if raw == "" {
		return
	}
	var cfg GenJobsSchedConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "proof scheduler: bad config:", err)
		os.Exit(2)
	}
	os.Exit(runGenJobsSched(cfg))
}
