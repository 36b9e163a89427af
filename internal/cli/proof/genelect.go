package proof

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/fenced-dev/fenced"
)

// GenElectConfig describes one generative run of client-go's elector over
// fencedk8s (RunGenElect).
type GenElectConfig struct {
	// Store is the authority's URL; MinFence the weakest fence the
	// election's lease accepts.
	Store    string
	MinFence fenced.FenceStrength
	// Seed draws the nemesis's schedule.
	Seed uint64
	// Members (default 3) elector processes; Duration (default 40s) of
	// the faults.
	Members  int
	Duration time.Duration
	// The elector's timing: default LeaseDuration 3s, RenewDeadline 2s,
	// RetryPeriod 0.5s.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// IgnoreLeaderContext is the test-only hazard switch (see
	// GenElectMemberConfig).
	IgnoreLeaderContext bool
	// Command starts an elector (a binary that calls MaybeRunWorker
	// first).
	Command func() *exec.Cmd
	Dir     string
	Logf    func(format string, args ...any)
}

// genElectRun is one elector run's controller.
type genElectRun struct {
	cfg      GenElectConfig
	election string
	rng      *rand.Rand
	rec      *electRecorder
	res      *partResource // the row's resource, where the leaders write
	proxied  bool
	workers
}

// RunGenElect runs Members elector processes of one election on Store, each
// through its own proxy on a networked store. Meanwhile a nemesis drawn
// from Seed strikes one fault at a time. It cuts an elector's link (its
// proxy stops forwarding) for 1.2 to 2 LeaseDurations. Or it stops an
// elector (SIGSTOP) as long, twice as often as the others. Or it kills one
// (-9, started again within a LeaseDuration). Or it breaks the election's
// lease (Client.Break). Three faults in four strike the leader. After a
// fault that struck the leader, the nemesis waits for the next term before
// the next fault. Past Duration, the faults go on until four struck a
// leader and the leaders wrote GenElectMinWrites times, up to 3 ×
// Duration. CheckGenElect judges the run.
func RunGenElect(ctx context.Context, cfg GenElectConfig) (GenElectReport, error) {
	if cfg.Members == 0 {
		cfg.Members = 3
	}
	if cfg.Duration == 0 {
		cfg.Duration = 40 * time.Second
	}
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{{&cfg.LeaseDuration, 3 * time.Second}, {&cfg.RenewDeadline, 2 * time.Second}, {&cfg.RetryPeriod, 500 * time.Millisecond}} {
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	if cfg.Command == nil {
		return GenElectReport{}, errors.New("proof: GenElectConfig.Command is nil")
	}
	keeps, res, err := openRow(ctx, cfg.Dir, cfg.Store, genElectResource)
	if err != nil {
		return GenElectReport{}, err
	}
	defer res.db.Close()
	if err := res.setup(ctx, 1); err != nil {
		return GenElectReport{}, err
	}
	rec, err := openElectRecorder(filepath.Join(cfg.Dir, genElectHistory))
	if err != nil {
		return GenElectReport{}, err
	}
	admc, err := fenced.Open(ctx, cfg.Store, nil)
	if err != nil {
		return GenElectReport{}, err
	}
	defer admc.Close()
	r := &genElectRun{
		cfg:      cfg,
		election: fmt.Sprintf("fenced-genelect-%d-%d", cfg.Seed, time.Now().UnixNano()),
		rng:      rand.New(rand.NewPCG(cfg.Seed, 1<<43)), rec: rec, res: res,
		proxied: networked(cfg.Store), workers: newWorkers(cfg.Dir),
	}
	started := time.Now()
	for i := range cfg.Members {
		if err := r.startMember(i); err != nil {
			r.stopAll()
			return GenElectReport{}, err
		}
	}
	dctx, stopDelay := context.WithCancel(ctx)
	delay := &partObserver{}
	var bg sync.WaitGroup
	bg.Add(1)
	go func() { defer bg.Done(); delay.measureDelay(dctx) }()
	nemErr := r.nemesis(ctx, admc)
	stopDelay()
	bg.Wait()
	r.stopAll()
	events, err := readElectHistory(filepath.Join(cfg.Dir, genElectHistory), true)
	if err != nil {
		return GenElectReport{}, err
	}
	writes, err := res.writes(ctx)
	if err != nil {
		return GenElectReport{}, err
	}
	rep := CheckGenElect(events, writes, ElectTiming{
		LeaseDuration: cfg.LeaseDuration, RenewDeadline: cfg.RenewDeadline, RetryPeriod: cfg.RetryPeriod,
		Keeps: keeps, SchedDelay: delay.maxDelay, StoreStalls: !r.proxied,
	})
	rep.Seed, rep.Duration = cfg.Seed, time.Since(started).Round(time.Second)
	return rep, nemErr
}

// startMember starts (or starts again) elector slot i, through a new
// proxy on a networked store.
func (r *genElectRun) startMember(i int) error {
	store := r.cfg.Store
	if r.proxied {
		var err error
		if store, err = r.workers.proxied(i, store); err != nil {
			return err
		}
	}
	mc := GenElectMemberConfig{
		Slot: i, Store: store, Election: r.election, MinFence: r.cfg.MinFence, Dir: r.cfg.Dir,
		LeaseDuration: r.cfg.LeaseDuration, RenewDeadline: r.cfg.RenewDeadline, RetryPeriod: r.cfg.RetryPeriod,
		IgnoreLeaderContext: r.cfg.IgnoreLeaderContext,
	}
	raw, err := json.Marshal(mc)
	if err != nil {
		return err
	}
	cmd := r.cfg.Command()
	cmd.Env = append(os.Environ(), envGenElect+"="+string(raw))
	return r.start(i, cmd, nil)
}

// leader returns the slot, pid and fence of the elector that samples
// saw leading (its work context live) within the last 300ms, the one of
// the highest fence if several did, if any.
func (r *genElectRun) leader() (slot, pid int, f uint64, ok bool) {
	evs, err := readElectHistory(filepath.Join(r.cfg.Dir, genElectHistory), false)
	if err != nil {
		return 0, 0, 0, false
	}
	now := Now()
	for i := len(evs) - 1; i >= 0; i-- {
		e := evs[i]
		if e.K != "s" {
			continue // a fault's line is written at its end, with its start's T
		}
		if time.Duration(now-e.T) > 300*time.Millisecond {
			break
		}
		if e.W && (!ok || e.Fence > f) {
			slot, pid, f, ok = e.Slot, e.PID, e.Fence, true
		}
	}
	return slot, pid, f, ok
}

// waitTerm waits up to within for a leader of a term above fence f.
func (r *genElectRun) waitTerm(ctx context.Context, f uint64, within time.Duration) bool {
	for end := time.Now().Add(within); time.Now().Before(end) && ctx.Err() == nil; {
		if _, _, g, ok := r.leader(); ok && g > f {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

// leaderFaults is how many faults on a leader a run makes at least, if
// 3 × Duration allows.
const leaderFaults = 4

// GenElectMinWrites is how many writes the leaders of a run make at least,
// if 3 × Duration allows: a run with fewer says little by its zeros.
const GenElectMinWrites = 100

// enough reports whether the run has struck leaderFaults leaders and its
// leaders have written GenElectMinWrites times. A starved machine's
// leaders write less, and recover later, in the same Duration.
func (r *genElectRun) enough(ctx context.Context, hurts int) bool {
	if hurts < leaderFaults {
		return false
	}
	var n int
	err := r.res.db.QueryRowContext(ctx, `SELECT count(*) FROM worklog`).Scan(&n)
	return err != nil || n >= GenElectMinWrites
}

// nemesis injects faults drawn from the seed until the Duration is over.
func (r *genElectRun) nemesis(ctx context.Context, admc *fenced.Client) error {
	ld := r.cfg.LeaseDuration
	between := func(lo, hi float64) time.Duration {
		return time.Duration((lo + r.rng.Float64()*(hi-lo)) * float64(ld))
	}
	sleep := func(d time.Duration) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
			return nil
		}
	}
	// Generous: only catches a run where no leader ever comes.
	if !r.waitTerm(ctx, 0, 30*time.Second) {
		return errors.New("proof: no elector led within 30s of the start")
	}
	// A stop twice as often: it is where client-go's own context
	// outlives the lease.
	kinds := []string{"stop", "stop", "kill", "break"}
	if r.proxied {
		kinds = append(kinds, "cut")
	}
	// Past the Duration, the run goes on (up to 3 × Duration) until
	// leaderFaults faults struck a leader and the leaders wrote enough: a
	// starved machine's samples come late, and a fault aimed at no known
	// leader hurts nobody.
	start, hurts := time.Now(), 0
	for d := time.Since(start); d < r.cfg.Duration || (!r.enough(ctx, hurts) && d < 3*r.cfg.Duration); d = time.Since(start) {
		if err := sleep(between(0.2, 0.6)); err != nil {
			return err
		}
		kind := kinds[r.rng.IntN(len(kinds))]
		lslot, lpid, lfence, isLeader := r.leader()
		target := r.rng.IntN(r.cfg.Members)
		if isLeader && (kind == "break" || r.rng.IntN(4) != 0) {
			target = lslot
		}
		hurt := isLeader && target == lslot
		if kind == "break" && !hurt {
			kind = "stop"
		}
		cmd, done := r.worker(target)
		ev := electEvent{K: "fault", Fault: kind, Slot: target, PID: cmd.Process.Pid, Hurt: hurt}
		if hurt {
			ev.PID, ev.Fence = lpid, lfence
		}
		ev.T = Now()
		r.cfg.Logf("seed %d: %s elector %d (leader: %t)", r.cfg.Seed, kind, target, hurt)
		var err error
		switch kind {
		case "cut":
			d := between(1.2, 2)
			for _, p := range r.proxies[target] {
				p.setDown(true)
			}
			err = sleep(d)
			for _, p := range r.proxies[target] {
				p.setDown(false)
			}
		case "stop":
			cmd.Process.Signal(syscall.SIGSTOP)
			err = sleep(between(1.2, 2))
			cmd.Process.Signal(syscall.SIGCONT)
		case "kill":
			cmd.Process.Kill()
			<-done
			if err = sleep(between(0, 1)); err == nil {
				err = r.startMember(target)
			}
		case "break":
			bctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			info, berr := admc.Break(bctx, r.election, "proof: generative elector", "nemesis")
			cancel()
			if berr != nil {
				ev.Err = berr.Error()
			} else {
				ev.Fence, lfence = info.Fence, info.Fence // what was broken
			}
		}
		ev.End = Now()
		r.rec.record(ev)
		if err != nil {
			return err
		}
		if hurt {
			hurts++
			// Generous: the checker judges how long it took.
			r.waitTerm(ctx, lfence, 10*ld)
		}
	}
	// Long enough for a hurt elector to end its term: RetryPeriod +
	// RenewDeadline, twice.
	return sleep(2 * (r.cfg.RetryPeriod + r.cfg.RenewDeadline))
}

// stopAll continues and kills every elector.
func (r *genElectRun) stopAll() {
	for i := range r.cfg.Members {
		cmd, done := r.worker(i)
		if cmd == nil {
			continue
		}
		cmd.Process.Signal(syscall.SIGCONT)
		cmd.Process.Kill()
		<-done
	}
	r.wg.Wait()
	r.closeProxies()
}

// readElectHistory reads an elector run's history; unless strict, it
// skips a line it cannot parse (the last one may be half written while
// the electors run).
func readElectHistory(path string, strict bool) ([]electEvent, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("proof: read history: %w", err)
	}
	defer f.Close()
	var evs []electEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		var e electEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			if strict {
				return nil, fmt.Errorf("proof: history %s line %d: %w", path, n, err)
			}
			continue
		}
		evs = append(evs, e)
	}
	return evs, sc.Err()
}
