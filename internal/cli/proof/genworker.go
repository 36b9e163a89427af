package proof

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fence"
	"github.com/fenced-dev/fenced/internal/backend/rediskit"
	"github.com/fenced-dev/fenced/internal/core/rootaccess"
	"github.com/fenced-dev/fenced/recipe"
)

// envGen carries a generative worker's GenWorkerConfig, as JSON.
const envGen = "FENCED_PROOF_GEN"

// Event kinds of the generative mode (see RunGen).
const (
	// SetMember is one lease of a set AcquireAll returned (Op is the
	// call's). Value is 1 if the set reported itself healthy (Err nil) when
	// it was returned.
	SetMember Kind = "set_member"
	// SetHealthyLost says a worker saw a set report itself healthy while
	// one of its leases had ended (Key names it).
	SetHealthyLost Kind = "set_healthy_lost"
	// LivePastValidity says a worker saw a lease's context live past the
	// lease's local validity on its own clock (Value: by how many ns).
	LivePastValidity Kind = "live_past_validity"
	// Observed is a holder the controller saw in the store's listing
	// (Owner is its digest).
	Observed Kind = "observed"
	// BreakInvoke and BreakDone bracket a Break (Fence: what was broken).
	BreakInvoke Kind = "break"
	BreakDone   Kind = "broken"
	// RenewedAfterBreak says a worker saw a lease it had broken renewed by
	// a request sent after the break completed. Its validity reached past
	// the break's end plus its TTL (Value: by how many ns).
	RenewedAfterBreak Kind = "renewed_after_break"
	// Piped is how many scripts the worker process's Redis driver has
	// sent through its pipeline so far (Value; see rediskit.PipedScripts).
	Piped Kind = "piped"
)

// GenWorkerConfig is what one generative worker process needs.
type GenWorkerConfig struct {
	Worker int    `json:"worker"`
	Seed   uint64 `json:"seed"`
	Store  string `json:"store"`
	// Prefix starts every key of the run.
	Prefix string `json:"prefix"`
	// Keys is the number of cold keys (pool leases), HotKeys the number
	// of contended ones.
	Keys    int `json:"keys"`
	HotKeys int `json:"hot_keys"`
	// MaxHeld bounds the pool of leases the worker holds at once.
	MaxHeld int `json:"max_held"`
	// Streams is the number of concurrent operation streams.
	Streams int `json:"streams"`
	// TTL of the contended leases; pool leases get PoolTTL.
	TTL     time.Duration `json:"ttl"`
	PoolTTL time.Duration `json:"pool_ttl"`
	// Grace is how far past its local validity a lease's context may be
	// seen live (timer latency on a loaded machine).
	Grace    time.Duration        `json:"grace"`
	MinFence fenced.FenceStrength `json:"min_fence"`
	Dir      string               `json:"dir"`
	// NoLossWatch hides the driver's loss watch from the Client (etcd),
	// so the worker learns of a lost grant from its renewals alone.
	NoLossWatch bool `json:"no_loss_watch,omitempty"`
}

// Key spaces of a generative run, under its prefix.
func hotKey(prefix string, i int) string    { return fmt.Sprintf("%sh:%d", prefix, i) }
func coldKey(prefix string, i int) string   { return fmt.Sprintf("%sk:%d", prefix, i) }
func cancelKey(prefix string, i int) string { return fmt.Sprintf("%sc:%d", prefix, i) }
func semName(prefix string) string          { return prefix + "h:sem" }
func electName(prefix string) string        { return prefix + "h:lead" }

// cancelTTLFactor makes the TTL of a lease asked for by an acquisition that
// is cancelled mid-way that many times the run's TTL, so that an orphan
// grant left by it outlives the orphan bound by far.
const cancelTTLFactor = 5

// genOps are the operations of the mix, with their weights.
var genOps = []struct {
	name   string
	weight int
}{
	{"hold", 40}, {"try", 10}, {"acquire", 12}, {"do", 8}, {"all", 10},
	{"sem", 5}, {"elect", 5}, {"cancel", 12}, {"break", 6},
}

type genWorker struct {
	cfg    GenWorkerConfig
	rec    *Recorder
	client *fenced.Client
	// breaker is a Client of its own for Breaks, so the driver holding
	// the leases hears of a break only from the store; opened at the
	// first break (see breakClient).
	breakerMu sync.Mutex
	breaker   *fenced.Client
	rcp       *recipes
	pid       int64
	// poolTTL is the TTL of the pool leases: cfg.PoolTTL, or, for the
	// worker whose loss watch is hidden, cfg.TTL (see unwatchedPool).
	poolTTL time.Duration
	seq     atomic.Int64

	mu   sync.Mutex
	held map[*fenced.Lease]heldLease // every lease the worker believes it holds
	sets map[*recipe.LeaseSet]struct{}
	pool []*fenced.Lease // pool leases, oldest first
	// broken are the pool leases the worker broke itself, with when the
	// Break returned.
	broken map[*fenced.Lease]time.Time
	// cpu measures this process's share of a CPU, for allowance.
	cpu cpuMeter
}

// unwatchedPool is the least number of pool leases the worker whose loss
// watch is hidden may hold. Its pool leases take the contended leases' TTL,
// so they share one etcd session with them and are renewed together a
// third of a TTL apart, in batches of hundreds of grants: more than a
// transaction's worth of key reads (128), so each batch is checked with a
// listing of the session's keys, and closer together than that listing is
// kept (1s). A renewal that began after a break and used a listing sent
// before it reports the broken grant held (issue 25 item 8); the breaks
// of this worker's own pool leases show it as a renewal after a break.
const unwatchedPool = 300

type heldLease struct {
	owner string // digest
	until time.Time
}

func (w *genWorker) op() int64 { return w.pid<<24 | w.seq.Add(1) }

func (w *genWorker) record(e Event) {
	if err := w.rec.Record(e); err != nil {
		fmt.Fprintln(os.Stderr, "proof worker:", err)
		os.Exit(1)
	}
}

func runGenWorker(cfg GenWorkerConfig) error {
	ctx := context.Background()
	rec, err := OpenRecorder(filepath.Join(cfg.Dir, historyFile), cfg.Worker)
	if err != nil {
		return err
	}
	defer rec.Close()
	w := &genWorker{cfg: cfg, rec: rec, pid: int64(os.Getpid()), poolTTL: cfg.PoolTTL, held: map[*fenced.Lease]heldLease{},
		sets: map[*recipe.LeaseSet]struct{}{}, broken: map[*fenced.Lease]time.Time{},
		cpu: cpuMeter{every: 200 * time.Millisecond, burst: time.Millisecond}}
	hooks := func(e fenced.Event) {
		if e.Kind == fenced.EventAcquire && e.Err == nil {
			if g, ok := e.Context.Value(setGrantsKey{}).(*setGrants); ok {
				g.granted(Now())
			}
		}
		if e.Kind == fenced.EventLost {
			w.record(Event{Kind: Lost, Key: e.Lease.Key(), Fence: e.Lease.Fence(), Err: errString(e.Err)})
		}
	}
	copts := &fenced.Options{Hook: hooks, MinBackoff: 5 * time.Millisecond, MaxBackoff: 100 * time.Millisecond, FallbackPoll: cfg.TTL}
	// The nemesis does not wait for the workers: the store may be paused
	// or down while a worker opens it (a loaded machine starts a worker in
	// seconds). An open that fails is tried again until the run stops.
	for {
		if w.client, err = fenced.Open(ctx, cfg.Store, copts); err == nil {
			break
		}
		if _, serr := os.Stat(filepath.Join(cfg.Dir, stopFile)); serr == nil || ctx.Err() != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "proof worker %d: open: %v; trying again\n", cfg.Worker, err)
		time.Sleep(100 * time.Millisecond)
	}
	if cfg.NoLossWatch {
		if w.client, cfg.NoLossWatch = withoutLossWatch(w.client, copts); cfg.NoLossWatch {
			fmt.Fprintf(os.Stderr, "proof worker %d: loss watch hidden\n", cfg.Worker)
			w.poolTTL = cfg.TTL
			w.cfg.MaxHeld = max(cfg.MaxHeld, unwatchedPool)
		}
	}
	opts := &fenced.LeaseOptions{TTL: cfg.TTL, MaxWait: 3 * cfg.TTL, MinFence: cfg.MinFence}
	if w.rcp, err = newRecipes(w.client, semName(cfg.Prefix), 2, electName(cfg.Prefix), opts); err != nil {
		return err
	}
	w.record(Event{Kind: WorkerStart})
	sctx, stopSampler := context.WithCancel(ctx)
	var sampler sync.WaitGroup
	sampler.Add(2)
	go func() { defer sampler.Done(); w.sample(sctx) }()
	go func() { defer sampler.Done(); w.cpu.run(sctx) }()
	var streams sync.WaitGroup
	for s := range cfg.Streams {
		streams.Add(1)
		go func() {
			defer streams.Done()
			rng := rand.New(rand.NewPCG(cfg.Seed, uint64(cfg.Worker)<<16|uint64(s)))
			for {
				if _, err := os.Stat(filepath.Join(cfg.Dir, stopFile)); err == nil {
					return
				}
				w.releaseDue(ctx)
				w.step(ctx, rng)
			}
		}()
	}
	streams.Wait()
	stopSampler()
	sampler.Wait()
	w.mu.Lock()
	pool := w.pool
	w.pool = nil
	w.mu.Unlock()
	for _, l := range pool {
		w.release(l)
	}
	w.client.Close()
	if w.breaker != nil {
		w.breaker.Close()
	}
	if n := rediskit.PipedScripts.Load(); n > 0 {
		w.record(Event{Kind: Piped, Value: n})
	}
	w.record(Event{Kind: WorkerExit})
	return nil
}

// step runs one operation drawn from rng.
func (w *genWorker) step(ctx context.Context, rng *rand.Rand) {
	name := drawOp(rng)
	cfg := w.cfg
	hot := hotKey(cfg.Prefix, rng.IntN(cfg.HotKeys))
	hold := time.Duration(rng.Int64N(int64(cfg.TTL / 5)))
	opts := &fenced.LeaseOptions{TTL: cfg.TTL, MaxWait: 3 * cfg.TTL, MinFence: cfg.MinFence}
	op := w.op()
	switch name {
	case "hold":
		w.stepHold(ctx, rng, op)
	case "try", "acquire":
		w.stepAcquire(ctx, op, name, hot, hold, opts)
	case "do":
		w.stepDo(ctx, op, hot, hold, opts)
	case "all":
		w.stepAll(ctx, rng, op, hold, opts)
	case "sem", "elect":
		w.stepRecipe(ctx, op, name, hold)
	case "cancel":
		w.stepCancel(ctx, rng, op, hot)
	case "break":
		w.stepBreak(ctx, rng, op, hot)
	}
}

// drawOp draws the name of an operation of genOps, by weight.
func drawOp(rng *rand.Rand) string {
	total := 0
	for _, o := range genOps {
		total += o.weight
	}
	n := rng.IntN(total)
	for _, o := range genOps {
		if n < o.weight {
			return o.name
		}
		n -= o.weight
	}
	return ""
}

// stepHold takes MaxHeld/100 pool leases at once (one in the CI slice),
// so that a worker of the long mode reaches thousands of held leases.
func (w *genWorker) stepHold(ctx context.Context, rng *rand.Rand, op int64) {
	cfg := w.cfg
	n := max(1, cfg.MaxHeld/100)
	type draw struct {
		key   string
		try   bool
		until time.Duration
	}
	draws := make([]draw, n)
	for i := range draws {
		draws[i] = draw{coldKey(cfg.Prefix, rng.IntN(cfg.Keys)), rng.IntN(2) == 0, time.Duration(rng.Int64N(int64(10 * cfg.PoolTTL)))}
	}
	var wg sync.WaitGroup
	for i, d := range draws {
		op := op
		if i > 0 {
			op = w.op()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.hold(ctx, op, d.key, d.try, d.until)
		}()
	}
	wg.Wait()
}

// stepAcquire tries or acquires hot ("try" or "acquire"), holds it and
// releases it.
func (w *genWorker) stepAcquire(ctx context.Context, op int64, name, hot string, hold time.Duration, opts *fenced.LeaseOptions) {
	w.invoke(op, name, hot)
	var l *fenced.Lease
	var err error
	if name == "try" {
		l, err = w.client.TryAcquire(ctx, hot, opts)
	} else {
		l, err = w.client.Acquire(ctx, hot, opts)
	}
	if w.granted(op, name, hot, l, err) {
		w.sleepUnder(l.Context(), hold)
		w.release(l)
	}
}

// stepDo holds hot through Client.Do for up to hold.
func (w *genWorker) stepDo(ctx context.Context, op int64, hot string, hold time.Duration, opts *fenced.LeaseOptions) {
	const name = "do"
	w.invoke(op, name, hot)
	var got *fenced.Lease
	err := w.client.Do(ctx, hot, opts, func(ctx context.Context, l *fenced.Lease) error {
		got = l
		w.granted(op, name, hot, l, nil)
		w.sleepUnder(ctx, hold)
		w.forget(l, ReleaseInvoke)
		return nil
	})
	if got == nil {
		w.granted(op, name, hot, nil, err)
	} else {
		w.record(Event{Kind: ReleaseDone, Key: hot, Fence: got.Fence(), Owner: fence.OwnerDigest(got.Owner()), Err: errString(err)})
	}
}

// stepAll acquires a set of 2 or 3 hot keys at once, checks it while it
// holds it, and releases it.
func (w *genWorker) stepAll(ctx context.Context, rng *rand.Rand, op int64, hold time.Duration, opts *fenced.LeaseOptions) {
	const name = "all"
	cfg := w.cfg
	n := 2 + rng.IntN(2)
	keys := map[string]bool{}
	for len(keys) < min(n, cfg.HotKeys) {
		keys[hotKey(cfg.Prefix, rng.IntN(cfg.HotKeys))] = true
	}
	var list []string
	for k := range keys {
		list = append(list, k)
		w.invoke(op, name, k)
	}
	grants := &setGrants{}
	set, err := acquireAll(context.WithValue(ctx, setGrantsKey{}, grants), w.client, list, opts)
	if err != nil {
		w.record(Event{Kind: AcquireFail, Op: op, Name: name, Err: errString(err)})
		return
	}
	// The members are recorded as of when the set's health was read (the
	// checker compares it with the other grants of their keys), however
	// late the records follow on a starved worker.
	asked, askedLocal := Now(), time.Now()
	healthy := set.Err() == nil
	if healthy {
		w.checkReturnedSet(set, askedLocal)
	}
	members := set.Leases()
	for i, l := range members {
		var confirmed int64
		if i < len(members)-1 {
			confirmed = grants.last()
		}
		w.record(Event{T: asked, Kind: SetMember, Op: op, Name: name, Key: l.Key(), Fence: l.Fence(), Owner: fence.OwnerDigest(l.Owner()),
			Value: boolInt(healthy), TTL: l.Options().TTL, Confirmed: confirmed})
		w.mu.Lock()
		w.held[l] = heldLease{owner: fence.OwnerDigest(l.Owner())}
		w.mu.Unlock()
	}
	w.mu.Lock()
	w.sets[set] = struct{}{}
	w.mu.Unlock()
	w.checkSet(set)
	w.sleepUnder(set.Context(), hold)
	w.checkSet(set)
	w.mu.Lock()
	delete(w.sets, set)
	for _, l := range set.Leases() {
		delete(w.held, l)
		w.record(Event{Kind: ReleaseInvoke, Key: l.Key(), Fence: l.Fence(), Owner: fence.OwnerDigest(l.Owner())})
	}
	w.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err = set.Release(rctx)
	cancel()
	w.record(Event{Kind: ReleaseDone, Op: op, Name: name, Err: errString(err)})
}

// stepRecipe takes a semaphore permit ("sem") or campaigns ("elect"),
// holds the lease and releases it.
func (w *genWorker) stepRecipe(ctx context.Context, op int64, name string, hold time.Duration) {
	cfg := w.cfg
	key := semName(cfg.Prefix)
	if name == "elect" {
		key = electName(cfg.Prefix)
	}
	w.invoke(op, name, key)
	actx, cancel := context.WithTimeout(ctx, 3*cfg.TTL)
	var l *fenced.Lease
	var err error
	if name == "sem" {
		l, err = w.rcp.permit(actx)
	} else {
		l, err = w.rcp.campaign(actx)
	}
	cancel()
	if w.granted(op, name, key, l, err) {
		w.sleepUnder(l.Context(), hold)
		w.release(l)
	}
}

// stepCancel waits for hot (or a cancel key) and cancels within 5 ms.
func (w *genWorker) stepCancel(ctx context.Context, rng *rand.Rand, op int64, hot string) {
	const name = "cancel"
	cfg := w.cfg
	key := hot
	if rng.IntN(2) == 0 {
		key = cancelKey(cfg.Prefix, rng.IntN(cfg.HotKeys))
	}
	co := &fenced.LeaseOptions{TTL: cancelTTLFactor * cfg.TTL, MaxWait: fenced.WaitForever, MinFence: cfg.MinFence}
	after := time.Duration(rng.Int64N(int64(5 * time.Millisecond)))
	w.invoke(op, name, key)
	actx, cancel := context.WithTimeout(ctx, after)
	l, err := w.client.Acquire(actx, key, co)
	cancel()
	if w.granted(op, name, key, l, err) {
		w.release(l)
	}
}

// stepBreak breaks hot's lease. Half the breaks hit one of the worker's
// own pool leases: it lives through renewals after the break, which must
// tell it.
func (w *genWorker) stepBreak(ctx context.Context, rng *rand.Rand, op int64, hot string) {
	const name = "break"
	key := hot
	var victim *fenced.Lease
	if rng.IntN(2) == 0 {
		w.mu.Lock()
		if len(w.pool) > 0 {
			victim = w.pool[rng.IntN(len(w.pool))]
			key = victim.Key()
		}
		w.mu.Unlock()
	}
	w.record(Event{Kind: BreakInvoke, Op: op, Name: name, Key: key})
	bc, err := w.breakClient(ctx)
	if err != nil {
		w.record(Event{Kind: BreakDone, Op: op, Name: name, Key: key, Err: errString(err)})
		return
	}
	info, err := bc.Break(ctx, key, "proof: generative break", fmt.Sprintf("worker %d", w.cfg.Worker))
	if err == nil && victim != nil && info.Fence == victim.Fence() {
		w.mu.Lock()
		w.broken[victim] = time.Now()
		w.mu.Unlock()
	}
	w.record(Event{Kind: BreakDone, Op: op, Name: name, Key: key, Fence: info.Fence, Owner: info.OwnerDigest, Err: errString(err)})
}

// breakClient returns the worker's Client for breaks, opening it if
// needed (an open that fails, the authority being down, is tried again at
// the next break).
func (w *genWorker) breakClient(ctx context.Context) (*fenced.Client, error) {
	w.breakerMu.Lock()
	defer w.breakerMu.Unlock()
	if w.breaker == nil {
		c, err := fenced.Open(ctx, w.cfg.Store, nil)
		if err != nil {
			return nil, err
		}
		w.breaker = c
	}
	return w.breaker, nil
}

// hold takes a pool lease on key (TryAcquire if try, else Acquire waiting
// up to a TTL) and keeps it for hold, evicting the oldest pool lease when
// the pool is full.
func (w *genWorker) hold(ctx context.Context, op int64, key string, try bool, hold time.Duration) {
	cfg := w.cfg
	po := &fenced.LeaseOptions{TTL: w.poolTTL, MinFence: cfg.MinFence}
	var l *fenced.Lease
	var err error
	w.invoke(op, "hold", key)
	if try {
		l, err = w.client.TryAcquire(ctx, key, po)
	} else {
		po.MaxWait = cfg.TTL
		l, err = w.client.Acquire(ctx, key, po)
	}
	if !w.granted(op, "hold", key, l, err) {
		return
	}
	w.mu.Lock()
	h := w.held[l]
	h.until = time.Now().Add(hold)
	w.held[l] = h
	w.pool = append(w.pool, l)
	var evict *fenced.Lease
	if len(w.pool) > cfg.MaxHeld {
		evict, w.pool = w.pool[0], w.pool[1:]
	}
	w.mu.Unlock()
	if evict != nil {
		w.release(evict)
	}
}

func (w *genWorker) invoke(op int64, name, key string) {
	w.record(Event{Kind: AcquireInvoke, Op: op, Name: name, Key: key})
}

// granted records the outcome of an acquisition and, on success, adds l to
// the leases the worker holds. It reports whether l was granted.
func (w *genWorker) granted(op int64, name, key string, l *fenced.Lease, err error) bool {
	if err != nil || l == nil {
		w.record(Event{Kind: AcquireFail, Op: op, Name: name, Key: key, Err: errString(err)})
		return false
	}
	d := fence.OwnerDigest(l.Owner())
	w.record(Event{Kind: AcquireOK, Op: op, Name: name, Key: l.Key(), Fence: l.Fence(), Owner: d, TTL: l.Options().TTL})
	w.mu.Lock()
	w.held[l] = heldLease{owner: d}
	w.mu.Unlock()
	return true
}

// forget drops l from the held leases, recording kind (ReleaseInvoke).
func (w *genWorker) forget(l *fenced.Lease, kind Kind) {
	w.mu.Lock()
	delete(w.held, l)
	delete(w.broken, l)
	w.mu.Unlock()
	w.record(Event{Kind: kind, Key: l.Key(), Fence: l.Fence(), Owner: fence.OwnerDigest(l.Owner())})
}

func (w *genWorker) release(l *fenced.Lease) {
	w.forget(l, ReleaseInvoke)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := l.Release(ctx)
	if errors.Is(err, fenced.ErrReleased) {
		err = nil
	}
	w.record(Event{Kind: ReleaseDone, Key: l.Key(), Fence: l.Fence(), Owner: fence.OwnerDigest(l.Owner()), Err: errString(err)})
}

// releaseDue releases the pool leases whose holding time is over (or
// that have ended).
func (w *genWorker) releaseDue(ctx context.Context) {
	now := time.Now()
	var due []*fenced.Lease
	w.mu.Lock()
	keep := w.pool[:0]
	for _, l := range w.pool {
		if h := w.held[l]; now.After(h.until) || l.Err() != nil {
			due = append(due, l)
		} else {
			keep = append(keep, l)
		}
	}
	w.pool = keep
	w.mu.Unlock()
	for _, l := range due {
		w.release(l)
	}
}

func (w *genWorker) sleepUnder(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// checkSet records a set that reports itself healthy while one of its
// leases has ended.
func (w *genWorker) checkSet(set *recipe.LeaseSet) {
	for _, l := range set.Leases() {
		if l.Err() != nil && set.Err() == nil {
			w.record(Event{Kind: SetHealthyLost, Key: l.Key(), Fence: l.Fence(), Owner: fence.OwnerDigest(l.Owner()),
				Err: errString(l.Err())})
			return
		}
	}
}

// setGrants is when the acquisitions of one AcquireAll call were granted,
// as the client's hook sees them (their contexts carry it under
// setGrantsKey): AcquireAll takes its keys one after another, so the last
// is its last key's grant, after which it renews the others.
type setGrants struct {
	mu sync.Mutex
	t  int64
}

type setGrantsKey struct{}

func (g *setGrants) granted(t int64) {
	g.mu.Lock()
	g.t = t
	g.mu.Unlock()
}

func (g *setGrants) last() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.t
}

// checkReturnedSet records a set AcquireAll returned that reported itself
// healthy (Err nil) when asked at asked, although one of its leases' local
// validity had run out by then (a set's Err reads its leases' Err, which
// read the client's clock). Validity only moves on, so a ValidUntil read
// after asked that is before it was already over at asked; the millisecond
// allows for ValidUntil mapping the client's clock onto time.Now's.
func (w *genWorker) checkReturnedSet(set *recipe.LeaseSet, asked time.Time) {
	for _, l := range set.Leases() {
		if until := rootaccess.ValidUntil(l); until.Add(time.Millisecond).Before(asked) {
			w.record(Event{Kind: SetHealthyLost, Key: l.Key(), Fence: l.Fence(), Owner: fence.OwnerDigest(l.Owner()),
				Err: fmt.Sprintf("AcquireAll returned it healthy %v past its lease's local validity",
					asked.Sub(until).Round(time.Millisecond))})
			return
		}
	}
}

// allowance is how far past its local validity a lease's context may be
// seen live now, and the CPU share it follows from. It is Grace divided by
// this process's recent share of a CPU: a starved process runs the timer
// that ends a lease late. It is at most 20 × Grace.
func (w *genWorker) allowance() (time.Duration, float64) {
	share := w.cpu.recent()
	return time.Duration(float64(w.cfg.Grace) / max(share, 0.05)), share
}

// sample looks, every few milliseconds, at every lease the worker holds,
// and records one whose context is live past its local validity (by more
// than allowance) on the worker's own clock. Time the process did not run for
// does not count: a round that starts late (the process was stopped, or
// starved of CPU, for more than Grace) marks a resumption, and a lease
// counts only once the process has run for Grace since both its validity
// ran out and the last resumption. No timer can fire in a stopped process;
// that pause is what the fence is for, not a lease outliving its validity.
func (w *genWorker) sample(ctx context.Context) {
	const every = 10 * time.Millisecond
	tick := time.NewTicker(every)
	defer tick.Stop()
	last := time.Now()
	resumed := last
	var piped int64 // the last Piped count recorded
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		began := time.Now()
		if began.Sub(last) > every+w.cfg.Grace/2 {
			resumed = began
		}
		last = began
		if n := rediskit.PipedScripts.Load(); n >= piped+100 {
			piped = n
			w.record(Event{Kind: Piped, Value: n})
		}
		w.mu.Lock()
		leases := make([]*fenced.Lease, 0, len(w.held))
		for l := range w.held {
			leases = append(leases, l)
		}
		sets := make([]*recipe.LeaseSet, 0, len(w.sets))
		for s := range w.sets {
			sets = append(sets, s)
		}
		// A renewal sent before the break returned gives a validity of at
		// most then plus the TTL; one beyond was sent after the break
		// and confirmed a grant that was gone.
		for l, at := range w.broken {
			if late := rootaccess.ValidUntil(l).Sub(at.Add(l.Options().TTL)); late > renewedSlack {
				delete(w.broken, l)
				w.record(Event{Kind: RenewedAfterBreak, Key: l.Key(), Fence: l.Fence(), Owner: fence.OwnerDigest(l.Owner()),
					Value: int64(late)})
			}
		}
		w.mu.Unlock()
		for _, l := range leases {
			until := rootaccess.ValidUntil(l)
			now := time.Now()
			if now.Sub(began) > w.cfg.Grace/2 {
				break // this round is starved; the next one looks again
			}
			from := until
			if resumed.After(from) {
				from = resumed
			}
			if l.Context().Err() != nil || now.Sub(from) <= w.cfg.Grace || renewedSince(l, until) {
				continue
			}
			if allowed, share := w.allowance(); now.Sub(from) > allowed {
				why := fmt.Sprintf("allowed %v: Grace %v at a CPU share of %.2f", allowed.Round(time.Millisecond), w.cfg.Grace, share)
				w.record(Event{Kind: LivePastValidity, Key: l.Key(), Fence: l.Fence(), Owner: fence.OwnerDigest(l.Owner()),
					Value: int64(now.Sub(until)), Err: why})
			}
		}
		for _, s := range sets {
			w.checkSet(s)
		}
	}
}

// renewedSlack allows for the clocks a lease's validity and the
// worker's time.Now read (they are the same clock, read a moment apart).
const renewedSlack = 20 * time.Millisecond

// renewedSince reports whether l's local validity has moved past until, a
// reading of its ValidUntil: a renewal confirmed in between. ValidUntil's
// readings of an unchanged validity differ by a few nanoseconds (it maps
// the client's clock onto time.Now's at each call), so equality would miss
// most samples; a renewal moves validity by a large part of a TTL.
func renewedSince(l *fenced.Lease, until time.Time) bool {
	return rootaccess.ValidUntil(l).After(until.Add(time.Millisecond))
}

// maybeRunGenWorker runs a generative worker and exits if this process was
// started as one.
func maybeRunGenWorker() {
	raw := os.Getenv(envGen)
	if raw == "" {
		return
	}
	var cfg GenWorkerConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "proof worker: bad config:", err)
		os.Exit(2)
	}
	if err := runGenWorker(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "proof worker:", err)
		os.Exit(1)
	}
	os.Exit(0)
}
