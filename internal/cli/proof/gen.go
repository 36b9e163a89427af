package proof

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/fenced-dev/fenced"
)

// GenConfig describes one generative run (RunGen).
type GenConfig struct {
	// Store is the authority's URL; MinFence the weakest fence the leases
	// accept.
	Store    string
	MinFence fenced.FenceStrength
	// Seed draws every worker's operations and the nemesis's schedule:
	// the same seed gives the same sequence of operations and faults
	// (their timing still depends on the machine).
	Seed uint64
	// Workers (default 3) processes each run Streams (default 6)
	// concurrent operation streams.
	Workers, Streams int
	// Keys cold keys (default 1000) hold the pool leases, at most MaxHeld
	// (default 100) per worker at once, with PoolTTL (default 4 TTLs);
	// HotKeys contended keys (default 6) take the rest of the mix.
	Keys, HotKeys, MaxHeld int
	PoolTTL                time.Duration
	// TTL of the contended leases; default 1s.
	TTL time.Duration
	// Duration of the workload; default 30s. With MinOps, the workload
	// runs on past Duration until the workers have invoked MinOps
	// operations, scaled by the share of a CPU the run measured
	// (GenReport.CPUShare), for at most MaxDuration in all (default 3 ×
	// Duration): a machine busy with other work runs fewer operations a
	// second, and a run of a few hundred proves less than the run of
	// thousands it was meant to be.
	Duration    time.Duration
	MinOps      int
	MaxDuration time.Duration
	// Grace is how late a lease's context may end after its local
	// validity (timer latency); default 100ms. OrphanBound is how long a
	// grant nobody was handed may be seen held while no fault is active;
	// default 2s (the Client looks for one for a second).
	Grace, OrphanBound time.Duration
	// Faults is what the nemesis draws from: any of M1 (stop a worker),
	// M4 (cut a worker off; needs a networked store), M5 (pause the
	// authority) and M6 (crash and restart it; both need Server). Empty:
	// every one the configuration allows.
	Faults []Fault
	Server Server
	// Command starts a worker (a binary that calls MaybeRunWorker first).
	Command func() *exec.Cmd
	// Dir is the run's directory.
	Dir string
	// Prefix starts every key of the run, before the seed and the run's
	// start time; default "fenced-gen:". fenced proof puts its runs under
	// its own prefix.
	Prefix string
	Logf   func(format string, args ...any)
}

// GenResult is a checked generative run.
type GenResult struct {
	Config GenConfig
	Report GenReport
	Events []Event
}

type genRun struct {
	cfg    GenConfig
	rec    *Recorder
	prefix string
	cpu    cpuMeter
	workers
}

// MinOpsAt is the fewest operations a run with GenConfig.MinOps ops must
// invoke. It is for a machine that gave the run share of a CPU
// (GenReport.CPUShare): ops scaled by the share, rounded up.
func MinOpsAt(ops int, share float64) int {
	return int(math.Ceil(float64(ops) * max(0, min(1, share))))
}

// networked reports whether store is reached over TCP (a proxy can cut a
// worker off from it).
func networked(store string) bool { return !strings.HasPrefix(store, "sqlite:") }

// RunGen runs a generative workload: Workers processes, each with Streams
// streams drawing operations from Seed. The operations are Acquire,
// TryAcquire, Do, AcquireAll, a semaphore permit, an election campaign, an
// Acquire cancelled after a few milliseconds, and a Break. Pool leases are
// also held for several TTLs, up to MaxHeld at once. Meanwhile the nemesis
// injects faults drawn from the same seed. A listing of the contended keys
// is recorded every 100ms. On etcd the last worker's Client does not see
// the driver's loss watch (see unwatchedEtcd). So its renewals alone must
// tell it of a break. CheckGen judges the history.
func RunGen(ctx context.Context, cfg GenConfig) (*GenResult, error) {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&cfg.Workers, 3)
	def(&cfg.Streams, 6)
	def(&cfg.Keys, 1000)
	def(&cfg.HotKeys, 6)
	def(&cfg.MaxHeld, 100)
	if cfg.TTL == 0 {
		cfg.TTL = time.Second
	}
	if cfg.PoolTTL == 0 {
		cfg.PoolTTL = 4 * cfg.TTL
	}
	if cfg.Duration == 0 {
		cfg.Duration = 30 * time.Second
	}
	if cfg.MaxDuration == 0 {
		cfg.MaxDuration = 3 * cfg.Duration
	}
	if cfg.Grace == 0 {
		cfg.Grace = 100 * time.Millisecond
	}
	if cfg.OrphanBound == 0 {
		cfg.OrphanBound = 2 * time.Second
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "fenced-gen:"
	}
	if len(cfg.Faults) == 0 {
		cfg.Faults = []Fault{PauseHolder}
		if networked(cfg.Store) {
			cfg.Faults = append(cfg.Faults, CutHolder)
		}
		if cfg.Server != nil {
			cfg.Faults = append(cfg.Faults, PauseAuthority, CrashAuthority)
		}
	}
	for _, f := range cfg.Faults {
		switch {
		case f == CutHolder && !networked(cfg.Store):
			return nil, fmt.Errorf("proof: fault M4 needs a networked store, not %s", cfg.Store)
		case (f == PauseAuthority || f == CrashAuthority) && cfg.Server == nil:
			return nil, fmt.Errorf("proof: fault %s needs GenConfig.Server", f)
		case f != PauseHolder && f != CutHolder && f != PauseAuthority && f != CrashAuthority:
			return nil, fmt.Errorf("proof: the generative nemesis does not inject %s", f)
		}
	}
	if cfg.Command == nil {
		return nil, errors.New("proof: GenConfig.Command is nil")
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, err
	}
	strength, keeps, err := declared(ctx, cfg.Store)
	if err != nil {
		return nil, err
	}
	// An orphan grant stands at most as long as the store keeps the
	// longest TTL one can have.
	orphanTTL := keeps.Outlives(cancelTTLFactor * cfg.TTL)
	r := &genRun{cfg: cfg, prefix: fmt.Sprintf("%s%d:%d:", cfg.Prefix, cfg.Seed, time.Now().UnixNano()), workers: newWorkers(cfg.Dir)}
	if r.rec, err = OpenRecorder(filepath.Join(cfg.Dir, historyFile), -1); err != nil {
		return nil, err
	}
	defer r.rec.Close()
	defer r.closeProxies()
	for i := range cfg.Workers {
		if err := r.startWorker(i); err != nil {
			r.stopWorkers()
			return nil, err
		}
	}
	octx, stopObserver := context.WithCancel(ctx)
	var observer sync.WaitGroup
	observer.Add(1)
	go func() { defer observer.Done(); r.observe(octx) }()
	nemErr := r.nemesis(ctx)
	r.stopWorkers()
	stopObserver()
	observer.Wait()
	events, err := ReadHistory(filepath.Join(cfg.Dir, historyFile))
	if err != nil {
		return nil, err
	}
	rep := CheckGen(events, strength, orphanTTL, cfg.OrphanBound)
	rep.Seed = cfg.Seed
	rep.CPUShare = r.cpu.share()
	return &GenResult{Config: cfg, Report: rep, Events: events}, nemErr
}

func (r *genRun) record(e Event) {
	if err := r.rec.Record(e); err != nil {
		r.cfg.Logf("proof: %v", err)
	}
}

func (r *genRun) startWorker(i int) error {
	store := r.cfg.Store
	if networked(store) {
		var err error
		if store, err = r.proxied(i, store); err != nil {
			return err
		}
	}
	wc := GenWorkerConfig{Worker: i, Seed: r.cfg.Seed, Store: store, Prefix: r.prefix, Keys: r.cfg.Keys, HotKeys: r.cfg.HotKeys,
		MaxHeld: r.cfg.MaxHeld, Streams: r.cfg.Streams, TTL: r.cfg.TTL, PoolTTL: r.cfg.PoolTTL, Grace: r.cfg.Grace,
		MinFence: r.cfg.MinFence, Dir: r.cfg.Dir, NoLossWatch: i == r.cfg.Workers-1 && r.cfg.Workers > 1}
	raw, err := json.Marshal(wc)
	if err != nil {
		return err
	}
	cmd := r.cfg.Command()
	cmd.Env = append(os.Environ(), envGen+"="+string(raw))
	return r.start(i, cmd, nil)
}

func (r *genRun) stopWorkers() { r.stop(r.cfg.Workers, 10*r.cfg.PoolTTL+30*time.Second, r.cfg.Logf) }

// observe records, every 100ms, the holders of the contended and the
// cancelled-acquire keys, as the store lists them.
func (r *genRun) observe(ctx context.Context) {
	c, err := fenced.Open(ctx, r.cfg.Store, nil)
	if err != nil {
		r.cfg.Logf("proof: observer: %v", err)
		return
	}
	defer c.Close()
	for ctx.Err() == nil {
		for _, p := range []string{r.prefix + "h:", r.prefix + "c:"} {
			lctx, cancel := context.WithTimeout(ctx, time.Second)
			asked := Now()
			infos, err := c.List(lctx, p)
			cancel()
			if err != nil {
				continue
			}
			now := Now()
			for _, in := range infos {
				if in.Held {
					r.record(Event{T: now, Asked: asked, Worker: -1, Kind: Observed, Key: in.Key, Fence: in.Fence, Owner: in.OwnerDigest})
				}
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// answered returns once the store answers a listing through c (nil: at
// once), or after a minute.
func (r *genRun) answered(ctx context.Context, c *fenced.Client) {
	if c == nil {
		return
	}
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline) && ctx.Err() == nil; {
		lctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := c.List(lctx, r.prefix+"h:")
		cancel()
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// nemesis injects, until the run's Duration is over, faults drawn from
// the seed: a pause of 0.5 to 2 TTLs between faults (one time in four a
// quiet spell of 4 to 8 TTLs), then one of
// cfg.Faults on a drawn worker, for a drawn time (0.5 to 3 TTLs; one cut
// (CutHolder) in three lasts 0.5 to 1.5 TTLs longer than the pool leases' TTL,
// so a worker's pool runs out behind it).
func (r *genRun) nemesis(ctx context.Context) error {
	n := newGenNemesis(r)
	mctx, stopMeter := context.WithCancel(ctx)
	defer stopMeter()
	go r.cpu.run(mctx)
	// An authority fault ends when the store answers again, not when the
	// restart was started: etcd replaying a large log takes seconds, and
	// the checker excuses what stands while the store cannot answer.
	if r.cfg.Server != nil {
		if c, err := fenced.Open(ctx, r.cfg.Store, nil); err == nil {
			n.probe = c
			defer c.Close()
		}
	}
	ttl := r.cfg.TTL
	for k := 1; n.running(); k++ {
		gap := n.between(0.5, 2)
		if n.rng.IntN(4) == 0 {
			gap = n.between(4, 8) // a quiet spell, for what only shows without faults
		}
		if err := n.sleep(ctx, gap); err != nil {
			return err
		}
		if !n.running() {
			break
		}
		f := r.cfg.Faults[n.rng.IntN(len(r.cfg.Faults))]
		w := n.rng.IntN(r.cfg.Workers)
		d := n.between(0.5, 3)
		r.cfg.Logf("seed %d: fault %d: %s worker %d for %v", r.cfg.Seed, k, f, w, d.Round(time.Millisecond))
		if err := n.inject(ctx, k, f, w, d); err != nil {
			return err
		}
	}
	// Let the workload settle after the last fault.
	select {
	case <-time.After(2 * ttl):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
