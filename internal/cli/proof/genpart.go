package proof

import (
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
	"github.com/fenced-dev/fenced/internal/core/limits"
	"github.com/fenced-dev/fenced/recipe"
)

// Files of a partitions run, in its directory.
const (
	genPartHistory  = "partitions-history.jsonl"
	genPartResource = "partitions-resource.db"
)

// GenPartConfig describes one generative run of recipe.Partitions
// (RunGenPartitions).
type GenPartConfig struct {
	// Store is the authority's URL; MinFence the weakest fence the
	// partition leases accept.
	Store    string
	MinFence fenced.FenceStrength
	// Seed draws the nemesis's schedule and the partition counts.
	Seed uint64
	// Members (default 4) member processes; Items (default 64) items,
	// routed to partitions by hash mod P; Counts the partition counts the
	// group is deployed with (default 2, 3, 4, 6, 8).
	Members, Items int
	Counts         []int
	// TTL of the leases (default 1s); Duration of the churn (default 40s).
	TTL, Duration time.Duration
	// Command starts a member (a binary that calls MaybeRunWorker first).
	Command func() *exec.Cmd
	Dir     string
	Logf    func(format string, args ...any)
}

// genPartRun is one partitions run's controller.
type genPartRun struct {
	cfg   GenPartConfig
	group string
	rng   *rand.Rand
	slots

	mu sync.Mutex
	// p is the count members are started with now.
	p      int
	faults map[string]int
	// longestStop is the longest SIGSTOP the nemesis applied.
	longestStop time.Duration
	// churnEnd is when the nemesis's last fault ended.
	churnEnd time.Time
	// knobs are the run's rebalancing settings and the members' weights.
	knobs partKnobs
	// outlives is how long the store keeps a grant after its holder's
	// last renewal (driver.Expiry.Outlives of the TTL).
	outlives time.Duration
}

// RunGenPartitions runs Members member processes of one partition group on
// Store. Meanwhile a nemesis drawn from Seed strikes them. It kills them
// (-9), stops them (SIGSTOP) past the TTL, makes them leave (SIGTERM) and
// restarts them. It also deploys another partition count. Then, sometimes,
// every member but one is ended (leave or kill) and started again with the
// new count. The one left out is stopped meanwhile, and continued later,
// still at the old count. A member that stops by itself (ErrPartitionCount,
// ErrMemberLive) is started again with the current count, as a supervisor
// would. One that stays live at an old count after the churn, with no
// member of the current count live, is replaced as a rollout would
// (see converge). The churn ends at a count other than the first one,
// with one more deploy if need be. An observer lists the group every 100ms.
// CheckGenPartitions judges the run.
func RunGenPartitions(ctx context.Context, cfg GenPartConfig) (GenPartReport, error) {
	if cfg.Members == 0 {
		cfg.Members = 4
	}
	if cfg.Items == 0 {
		cfg.Items = 64
	}
	if len(cfg.Counts) == 0 {
		cfg.Counts = []int{2, 3, 4, 6, 8}
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
		return GenPartReport{}, errors.New("proof: GenPartConfig.Command is nil")
	}
	keeps, res, err := openRow(ctx, cfg.Dir, cfg.Store, genPartResource)
	if err != nil {
		return GenPartReport{}, err
	}
	defer res.db.Close()
	maxP := 0
	for _, p := range cfg.Counts {
		if p < 1 || p > limits.MaxPartitions {
			return GenPartReport{}, fmt.Errorf("proof: partition count %d out of 1..%d", p, limits.MaxPartitions)
		}
		maxP = max(maxP, p)
	}
	if err := res.setup(ctx, maxP); err != nil {
		return GenPartReport{}, err
	}
	r := &genPartRun{
		cfg:   cfg,
		group: fmt.Sprintf("fenced-genpart-%d-%d", cfg.Seed, time.Now().UnixNano()),
		rng:   rand.New(rand.NewPCG(cfg.Seed, 1<<41)), slots: newSlots(cfg.Dir, cfg.Members, "member", cfg.Seed, cfg.Logf),
		faults: map[string]int{}, outlives: keeps.Outlives(cfg.TTL),
	}
	r.restart = r.startMember
	r.quiet = func(code int) bool { return code == exitPartitionCount || code == exitMemberLive }
	r.p = cfg.Counts[r.rng.IntN(len(cfg.Counts))]
	r.knobs = drawPartKnobs(cfg.Seed, cfg.Members)
	cfg.Logf("seed %d: %v", cfg.Seed, r.knobs)
	started := time.Now()
	for i := range cfg.Members {
		if err := r.startMember(i); err != nil {
			r.stopAll()
			return GenPartReport{}, err
		}
	}
	octx, stopObserver := context.WithCancel(ctx)
	obs := &partObserver{}
	var bg sync.WaitGroup
	bg.Add(2)
	go func() { defer bg.Done(); obs.watch(octx, cfg.Store, r.group) }()
	go func() { defer bg.Done(); obs.measureDelay(octx) }()
	nemErr := r.nemesis(ctx)
	conv := r.converge(ctx)
	// The observer stops first: the members' leaves at the end free
	// their partitions, which is no spell to judge.
	stopObserver()
	bg.Wait()
	r.stopAll()
	writes, err := res.writes(ctx)
	if err != nil {
		return GenPartReport{}, err
	}
	events, err := readPartHistory(filepath.Join(cfg.Dir, genPartHistory))
	if err != nil {
		return GenPartReport{}, err
	}
	rep := CheckGenPartitions(events, writes, cfg.Items)
	rep.Seed, rep.Duration = cfg.Seed, time.Since(started).Round(time.Second)
	r.mu.Lock()
	rep.Faults, rep.Exits = r.faults, r.exitCounts()
	r.mu.Unlock()
	// A member stopped inside a write of a SQLite store holds the
	// file's write lock for its whole stop, stalling every other
	// member's grants: there, the longest stop is part of the bound.
	var stall time.Duration
	if !networked(cfg.Store) {
		r.mu.Lock()
		stall = r.longestStop
		r.mu.Unlock()
	}
	rep.judgeRecovery(obs, keeps.Outlives(cfg.TTL), cfg.TTL, stall)
	r.mu.Lock()
	p := r.p
	r.mu.Unlock()
	rep.judgeConvergence(conv, r.knobs, p, keeps.Outlives(cfg.TTL), cfg.TTL)
	return rep, nemErr
}

// startMember starts slot i with the current count.
func (r *genPartRun) startMember(i int) error {
	r.mu.Lock()
	p := r.p
	r.mu.Unlock()
	r.started(i)
	mc := GenPartMemberConfig{Slot: i, Member: fmt.Sprintf("m%d", i), P: p, Items: r.cfg.Items, Store: r.cfg.Store, Group: r.group,
		TTL: r.cfg.TTL, MinFence: r.cfg.MinFence, Dir: r.cfg.Dir, Weight: r.knobs.weights[i], Threshold: r.knobs.threshold,
		Dampening: r.knobs.dampening, MaxInTransition: r.knobs.maxInTransition}
	raw, err := json.Marshal(mc)
	if err != nil {
		return err
	}
	cmd := r.cfg.Command()
	cmd.Env = append(os.Environ(), envGenPart+"="+string(raw))
	return r.start(i, cmd, nil)
}

// stopped notes a SIGSTOP of d.
func (r *genPartRun) stopped(d time.Duration) {
	r.mu.Lock()
	r.longestStop = max(r.longestStop, d)
	r.mu.Unlock()
}

// nemesis injects faults drawn from the seed until the Duration is over:
// a pause of 0.3 to 1.5 TTLs, then one of kill (-9, started again after up
// to a TTL), stop (SIGSTOP for 1.5 to 3 TTLs), leave (SIGTERM, started
// again after up to half a TTL) or deploy (a new count; see
// RunGenPartitions: the member left out is stopped for 1.5 to 3 TTLs).
func (r *genPartRun) nemesis(ctx context.Context) error {
	ttl := r.cfg.TTL
	end := time.Now().Add(r.cfg.Duration)
	halfway := time.Now().Add(r.cfg.Duration / 2)
	r.mu.Lock()
	first := r.p
	r.mu.Unlock()
	if err := r.sleep(ctx, 2*ttl); err != nil { // let the group form
		return err
	}
	for time.Now().Before(end) {
		if err := r.sleep(ctx, r.between(0.3, 1.5)); err != nil {
			return err
		}
		w := r.rng.IntN(r.cfg.Members)
		kind := []string{"kill", "kill", "stop", "stop", "leave", "deploy", "deploy"}[r.rng.IntN(7)]
		if r.faults["deploy"] == 0 && time.Now().After(halfway) {
			kind = "deploy" // every run deploys another count at least once
		}
		r.hold(w, true)
		var err error
		switch kind {
		case "kill", "leave":
			err = r.restartMember(ctx, w, kind)
		case "stop":
			err = r.stopMember(ctx, w)
		case "deploy":
			err = r.deploy(ctx, w)
		}
		if err != nil {
			return err
		}
		r.mu.Lock()
		r.faults[kind]++
		r.mu.Unlock()
		r.hold(w, false)
	}
	// The churn ends at a count other than the first. A deploy whose
	// sleeper came back first leaves the group at the old count; a deploy
	// back to the first count would leave the row one count's work. The
	// convergence replaces a straggler, so the last count owns partitions.
	r.mu.Lock()
	back := r.p == first && len(r.cfg.Counts) > 1
	r.mu.Unlock()
	if back {
		w := r.rng.IntN(r.cfg.Members)
		r.hold(w, true)
		if err := r.deploy(ctx, w); err != nil {
			return err
		}
		r.mu.Lock()
		r.faults["deploy"]++
		r.mu.Unlock()
		r.hold(w, false)
	}
	r.mu.Lock()
	r.churnEnd = time.Now()
	r.mu.Unlock()
	return nil
}

// between draws a time from lo to hi TTLs.
func (r *genPartRun) between(lo, hi float64) time.Duration {
	return time.Duration((lo + r.rng.Float64()*(hi-lo)) * float64(r.cfg.TTL))
}

// restartMember ends member w (kind "kill" or "leave") and starts it again
// after up to a TTL (a leave: up to half a TTL).
func (r *genPartRun) restartMember(ctx context.Context, w int, kind string) error {
	r.cfg.Logf("seed %d: %s member %d", r.cfg.Seed, kind, w)
	r.end(w, kind == "kill")
	lo := r.between(0, 1)
	if kind == "leave" {
		lo /= 2
	}
	if err := r.sleep(ctx, lo); err != nil {
		return err
	}
	return r.startMember(w)
}

// stopMember stops member w (SIGSTOP) for 1.5 to 3 TTLs.
func (r *genPartRun) stopMember(ctx context.Context, w int) error {
	d := r.between(1.5, 3)
	r.stopped(d)
	r.cfg.Logf("seed %d: stop member %d for %v", r.cfg.Seed, w, d.Round(time.Millisecond))
	cmd, _ := r.worker(w)
	cmd.Process.Signal(syscall.SIGSTOP)
	err := r.sleep(ctx, d)
	cmd.Process.Signal(syscall.SIGCONT)
	return err
}

// deploy moves the group to a new count: every member but one ends (a
// kill or a leave) and starts again. Two times in three, member w is
// left out, stopped at the old count for 1.5 to 3 TTLs.
func (r *genPartRun) deploy(ctx context.Context, w int) error {
	r.mu.Lock()
	old := r.p
	for r.p == old && len(r.cfg.Counts) > 1 {
		r.p = r.cfg.Counts[r.rng.IntN(len(r.cfg.Counts))]
	}
	p := r.p
	r.mu.Unlock()
	sleeper := -1
	if r.rng.IntN(3) != 0 {
		sleeper = w // left out: stopped at the old count
	}
	kills := make([]bool, r.cfg.Members)
	for i := range kills {
		kills[i] = r.rng.IntN(2) == 0
	}
	d := r.between(1.5, 3)
	r.cfg.Logf("seed %d: deploy %d → %d partitions, member %d stopped at %d for %v", r.cfg.Seed, old, p, sleeper, old,
		d.Round(time.Millisecond))
	var sleeperCmd *exec.Cmd
	if sleeper >= 0 {
		r.stopped(d)
		sleeperCmd, _ = r.worker(sleeper)
		sleeperCmd.Process.Signal(syscall.SIGSTOP)
	}
	for i := range r.cfg.Members {
		if i == sleeper {
			continue
		}
		r.hold(i, true)
		r.end(i, kills[i])
	}
	for i := range r.cfg.Members {
		if i == sleeper {
			continue
		}
		err := r.startMember(i)
		r.hold(i, false)
		if err != nil {
			return err
		}
	}
	if sleeper >= 0 {
		err := r.sleep(ctx, d)
		sleeperCmd.Process.Signal(syscall.SIGCONT)
		if err != nil {
			return err
		}
	}
	return nil
}

// partObserver lists the group every 100ms and keeps, for the count its
// live members all have, how long each partition went without a lease
// while a member of that count was live; and measures the controller's
// scheduling delay.
type partObserver struct {
	mu sync.Mutex
	// longest unowned spell, and the partition and when (Now) it began.
	longest      time.Duration
	longestPart  int
	longestAt    int64
	spells, list int
	// maxDelay is the longest a 10ms sleep overslept.
	maxDelay time.Duration
	// maxList is the longest listing (a store round trip or more).
	maxList time.Duration
}

func (o *partObserver) watch(ctx context.Context, store, group string) {
	c, err := fenced.Open(ctx, store, nil)
	if err != nil {
		return
	}
	defer c.Close()
	var p int
	since := map[int]int64{} // partition → first listing that saw it free
	closeSpell := func(i int, now int64) {
		from := since[i]
		delete(since, i)
		d := time.Duration(now - from)
		o.mu.Lock()
		o.spells++
		if d > o.longest {
			o.longest, o.longestPart, o.longestAt = d, i, from
		}
		o.mu.Unlock()
	}
	for ctx.Err() == nil {
		lctx, cancel := context.WithTimeout(ctx, time.Second)
		began := Now()
		st, err := recipe.ReadGroup(lctx, c, group)
		cancel()
		now := Now()
		if err == nil {
			o.mu.Lock()
			o.list++
			o.maxList = max(o.maxList, time.Duration(now-began))
			o.mu.Unlock()
			counts := map[int]bool{}
			for _, m := range st.Members {
				counts[m.Partitions] = true
			}
			cur := 0
			if len(counts) == 1 {
				for n := range counts {
					cur = n
				}
			}
			if cur != p {
				clear(since) // another count, or none: not judged
				p = cur
			}
			for i := range p {
				_, held := st.Leases[i]
				_, free := since[i]
				switch {
				case held && free:
					closeSpell(i, now)
				case !held && !free:
					since[i] = now
				}
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	for i := range since {
		closeSpell(i, Now())
	}
}

func (o *partObserver) measureDelay(ctx context.Context) {
	const d = 10 * time.Millisecond
	for ctx.Err() == nil {
		t := time.Now()
		time.Sleep(d)
		if late := time.Since(t) - d; late > 0 {
			o.mu.Lock()
			o.maxDelay = max(o.maxDelay, late)
			o.mu.Unlock()
		}
	}
}
