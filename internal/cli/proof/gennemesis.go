package proof

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"syscall"
	"time"

	"github.com/fenced-dev/fenced"
)

// genNemesis draws a generative run's faults from its seed and injects them.
// It has one method per fault.
type genNemesis struct {
	r          *genRun
	rng        *rand.Rand
	began, end time.Time
	ops        opCounter
	// probe lists the store to learn when it answers again (nil: no server).
	probe *fenced.Client
}

// newGenNemesis returns r's nemesis, its clock started now.
func newGenNemesis(r *genRun) *genNemesis {
	began := time.Now()
	return &genNemesis{
		r:     r,
		rng:   rand.New(rand.NewPCG(r.cfg.Seed, 1<<40)),
		began: began,
		end:   began.Add(r.cfg.Duration),
		ops:   opCounter{path: filepath.Join(r.cfg.Dir, historyFile)},
	}
}

// running reports whether the workload goes on: until end, then, while
// the workers have invoked fewer than MinOps operations, by another
// few TTLs at a time, up to MaxDuration.
func (n *genNemesis) running() bool {
	cfg := n.r.cfg
	now := time.Now()
	if now.Before(n.end) {
		return true
	}
	limit := n.began.Add(cfg.MaxDuration)
	if cfg.MinOps <= 0 || !now.Before(limit) {
		return false
	}
	count, err := n.ops.count()
	if err != nil {
		cfg.Logf("proof: counting operations: %v", err)
		return false
	}
	share := n.r.cpu.share()
	need := MinOpsAt(cfg.MinOps, share)
	if count >= need {
		return false
	}
	if n.end = now.Add(4 * cfg.TTL); n.end.After(limit) {
		n.end = limit
	}
	cfg.Logf("seed %d: %d operations in %v, fewer than %d (%d at a CPU share of %.2f): the workload runs on until %v", cfg.Seed, count,
		now.Sub(n.began).Round(time.Millisecond), need, cfg.MinOps, share, n.end.Sub(n.began).Round(time.Millisecond))
	return true
}

// between draws a time from lo to hi TTLs.
func (n *genNemesis) between(lo, hi float64) time.Duration {
	return time.Duration((lo + n.rng.Float64()*(hi-lo)) * float64(n.r.cfg.TTL))
}

// sleep waits for d, cut short at the end of the run or of ctx.
func (n *genNemesis) sleep(ctx context.Context, d time.Duration) error {
	d = min(d, max(0, time.Until(n.end)))
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// inject injects fault f, the run's k-th, on worker w for about d.
func (n *genNemesis) inject(ctx context.Context, k int, f Fault, w int, d time.Duration) error {
	switch f {
	case PauseHolder:
		n.pauseHolder(ctx, w, d)
	case CutHolder:
		n.cutHolder(ctx, k, w, d)
	case PauseAuthority:
		return n.pauseAuthority(ctx, d)
	case CrashAuthority:
		return n.crashAuthority(ctx)
	}
	return nil
}

// pauseHolder stops worker w (SIGSTOP) for d.
func (n *genNemesis) pauseHolder(ctx context.Context, w int, d time.Duration) {
	r := n.r
	cmd, _ := r.worker(w)
	cmd.Process.Signal(syscall.SIGSTOP)
	r.record(Event{Kind: FaultStart, Worker: w, Fault: string(PauseHolder)})
	n.sleep(ctx, d)
	cmd.Process.Signal(syscall.SIGCONT)
	r.record(Event{Kind: FaultEnd, Worker: w, Fault: string(PauseHolder)})
}

// cutHolder cuts worker w off from the store for d. One cut in three is
// long: past the pool leases' TTL.
func (n *genNemesis) cutHolder(ctx context.Context, k, w int, d time.Duration) {
	r := n.r
	if n.rng.IntN(3) == 0 {
		// A long cut: the worker's pool leases (PoolTTL) all run
		// out behind it at once, with their driver calls blocked.
		d = r.cfg.PoolTTL + n.between(0.5, 1.5)
		r.cfg.Logf("seed %d: fault %d: a long cut, %v", r.cfg.Seed, k, d.Round(time.Millisecond))
	}
	r.record(Event{Kind: FaultStart, Worker: w, Fault: string(CutHolder)})
	for _, p := range r.proxies[w] {
		p.setDown(true)
	}
	n.sleep(ctx, d)
	for _, p := range r.proxies[w] {
		p.setDown(false)
	}
	r.record(Event{Kind: FaultEnd, Worker: w, Fault: string(CutHolder)})
}

// pauseAuthority pauses the store for d, at most 2 TTLs. The fault ends
// once the store answers again.
func (n *genNemesis) pauseAuthority(ctx context.Context, d time.Duration) error {
	r := n.r
	if err := r.cfg.Server.Pause(); err != nil {
		return err
	}
	r.record(Event{Kind: FaultStart, Worker: -1, Fault: string(PauseAuthority)})
	n.sleep(ctx, min(d, 2*r.cfg.TTL))
	err := r.cfg.Server.Resume()
	r.answered(ctx, n.probe)
	r.record(Event{Kind: FaultEnd, Worker: -1, Fault: string(PauseAuthority)})
	return err
}

// crashAuthority kills the store and restarts it. The fault ends once
// the store answers again.
func (n *genNemesis) crashAuthority(ctx context.Context) error {
	r := n.r
	if err := r.cfg.Server.Crash(); err != nil {
		return err
	}
	r.record(Event{Kind: FaultStart, Worker: -1, Fault: string(CrashAuthority)})
	err := r.cfg.Server.Restart()
	if err == nil {
		r.answered(ctx, n.probe)
	}
	r.record(Event{Kind: FaultEnd, Worker: -1, Fault: string(CrashAuthority)})
	return err
}
