package proof

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fence"
	"github.com/fenced-dev/fenced/internal/cli/supervise"
)

// Ordering is how a holder guards its work at the resource (see the seed's
// two orderings).
type Ordering string

const (
	// ClaimFirst records the holder's fence on the resource first thing
	// after acquiring. It does so in the same transaction as the read of
	// the state it inherits. A stale holder's write is then refused
	// wherever it lands.
	ClaimFirst Ordering = "claim-first"
	// WriteOnly reads without claiming and guards only the write. A stale
	// write that reaches the resource before the new holder's first write
	// is accepted. The new holder then builds on state read before it
	// (fault M13).
	WriteOnly Ordering = "write-only"
)

// envWorker carries a worker's WorkerConfig, as JSON, to the re-executed
// binary.
const envWorker = "FENCED_PROOF_WORKER"

// WorkerConfig is what one worker process needs. The controller passes it
// in the environment.
type WorkerConfig struct {
	// Worker is the worker's number.
	Worker int `json:"worker"`
	// Store is the store URL the worker opens (through its own proxy when
	// the run has proxies).
	Store string `json:"store"`
	// Keys are the lease keys; the worker takes them in turn.
	Keys []string `json:"keys"`
	// TTL of every lease.
	TTL time.Duration `json:"ttl"`
	// Work is the time between the read and the write.
	Work time.Duration `json:"work"`
	// Fencing says whether the resource checks fences.
	Fencing bool `json:"fencing"`
	// Ordering is the guard ordering (with fencing).
	Ordering Ordering `json:"ordering"`
	// MinFence is the weakest fence the worker's leases accept.
	MinFence fenced.FenceStrength `json:"min_fence"`
	// Dir is the run's directory: history, resource, arming files.
	Dir string `json:"dir"`
	// Locker, if set, names the registered Locker the worker locks with
	// instead of fenced (Fencing is then false).
	Locker string `json:"locker,omitempty"`
	// ClockRate, if not 0, is the rate the worker's clock runs at against
	// the real one (fault SkewClockRate): the client's and the driver's
	// clock, which measure validity, time renewals and, on a store
	// without a server clock, watch other owners' grants. Only dynamodb://
	// stores take it.
	ClockRate float64 `json:"clock_rate,omitempty"`
}

// Files of a run directory.
const (
	historyFile  = "history.jsonl"
	resourceFile = "resource.db"
	stopFile     = "stop"
)

// MaybeRunWorker runs a worker and exits the process if this process was
// started as one by a Run; otherwise it returns at once. Call it first in
// TestMain, or early in main.
func MaybeRunWorker() {
	maybeRunGenWorker()
	maybeRunGenPartMember()
	maybeRunGenJobsSched()
	maybeRunGenElectMember()
	raw := os.Getenv(envWorker)
	if raw == "" {
		return
	}
	var cfg WorkerConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "proof worker: bad config:", err)
		os.Exit(2)
	}
	if err := runWorker(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "proof worker:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

type worker struct {
	cfg    WorkerConfig
	rec    *Recorder
	res    *Resource
	client *fenced.Client
	locker Locker
	seq    atomic.Int64
	pid    int64
	late   sync.WaitGroup // delayed writes still in flight
}

// op returns a number unique within the run: the process id and a
// sequence number.
func (w *worker) op() int64 { return w.pid<<24 | w.seq.Add(1) }

func runWorker(cfg WorkerConfig) error {
	ctx := context.Background()
	rec, err := OpenRecorder(filepath.Join(cfg.Dir, historyFile), cfg.Worker)
	if err != nil {
		return err
	}
	defer rec.Close()
	res, err := OpenResource(filepath.Join(cfg.Dir, resourceFile))
	if err != nil {
		return err
	}
	defer res.Close()
	w := &worker{cfg: cfg, rec: rec, res: res, pid: int64(os.Getpid())}
	if cfg.Locker != "" {
		open, err := lookupLocker(cfg.Locker)
		if err != nil {
			return err
		}
		if w.locker, err = open(ctx, cfg.Store); err != nil {
			return err
		}
		defer w.locker.Close()
	} else {
		hooks := func(e fenced.Event) {
			switch e.Kind {
			case fenced.EventLost:
				w.record(Event{Kind: Lost, Key: e.Lease.Key(), Fence: e.Lease.Fence(), Err: errString(e.Err)})
			case fenced.EventRenew:
				k := Renewed
				if e.Err != nil {
					k = RenewFail
				}
				w.record(Event{Kind: k, Key: e.Lease.Key(), Fence: e.Lease.Fence(), Err: errString(e.Err)})
			}
		}
		opts := &fenced.Options{Hook: hooks, MinBackoff: 5 * time.Millisecond, MaxBackoff: 100 * time.Millisecond, FallbackPoll: cfg.TTL}
		if w.client, err = openSkewed(ctx, cfg.Store, opts, cfg.ClockRate); err != nil {
			return err
		}
		defer w.client.Close()
	}
	w.record(Event{Kind: WorkerStart})
	for i := 0; ; i++ {
		w.waitGate()
		if _, err := os.Stat(filepath.Join(cfg.Dir, stopFile)); err == nil {
			break
		}
		w.round(ctx, cfg.Keys[i%len(cfg.Keys)])
	}
	w.late.Wait()
	w.record(Event{Kind: WorkerExit})
	return nil
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return strings.ReplaceAll(err.Error(), "\n", " ")
}

// record appends e; a worker that cannot record exits, since a history
// with holes proves nothing.
func (w *worker) record(e Event) {
	if err := w.rec.Record(e); err != nil {
		fmt.Fprintln(os.Stderr, "proof worker:", err)
		os.Exit(1)
	}
}

// round is one acquire, read, work, write, release cycle on key.
func (w *worker) round(ctx context.Context, key string) {
	op := w.op()
	w.record(Event{Kind: AcquireInvoke, Op: op, Key: key})
	actx, cancel := context.WithTimeout(ctx, 20*w.cfg.TTL+10*time.Second)
	l, err := w.acquire(actx, key, op)
	cancel()
	if err != nil {
		w.record(Event{Kind: AcquireFail, Op: op, Key: key, Err: errString(err)})
		time.Sleep(w.cfg.TTL / 10)
		return
	}
	defer l.cancel()
	tok := l.tok
	w.record(Event{Kind: AcquireOK, Op: op, Key: key, Fence: tok.Fence, Owner: tok.Owner})
	defer w.release(l)

	// Read the state the holder inherits (claiming it first, in that
	// ordering).
	op = w.op()
	w.record(Event{Kind: ReadInvoke, Op: op, Key: key, Fence: tok.Fence, Owner: tok.Owner})
	var prev int64
	if w.cfg.Fencing && w.cfg.Ordering == ClaimFirst {
		out, err := w.res.ClaimRead(l.ctx, key, tok, op)
		switch {
		case err != nil:
			w.record(Event{Kind: ReadFail, Op: op, Key: key, Fence: tok.Fence, Owner: tok.Owner, Err: errString(err)})
			return
		case !out.Applied:
			w.record(Event{Kind: ReadRefused, Op: op, Key: key, Fence: tok.Fence, Owner: tok.Owner, Current: out.Current})
			return
		}
		prev = out.Length
	} else {
		prev, err = w.res.Read(l.ctx, key)
		if err != nil {
			w.record(Event{Kind: ReadFail, Op: op, Key: key, Fence: tok.Fence, Owner: tok.Owner, Err: errString(err)})
			return
		}
	}
	w.record(Event{Kind: ReadOK, Op: op, Key: key, Fence: tok.Fence, Owner: tok.Owner, Value: prev})

	// Work, then check the lease as a careful worker does. The check
	// narrows the window but cannot close it: the faults strike after it.
	select {
	case <-time.After(w.cfg.Work):
	case <-l.ctx.Done():
	}
	if err := l.check(); err != nil {
		w.record(Event{Kind: Abandon, Key: key, Fence: tok.Fence, Owner: tok.Owner, Err: errString(err)})
		return
	}
	delay := w.atPoint("before-write")

	op = w.op()
	w.record(Event{Kind: WriteInvoke, Op: op, Key: key, Fence: tok.Fence, Owner: tok.Owner, Prev: prev, Value: prev + 1})
	if delay > 0 {
		// The write is on its way but arrives late; the worker gives up
		// waiting for it, treats its outcome as unknown and moves on.
		w.late.Add(1)
		go func() {
			defer w.late.Done()
			time.Sleep(delay)
			out, err := w.res.Append(ctx, key, tok, prev, w.cfg.Fencing, w.cfg.Worker, op)
			w.record(Event{Kind: FaultEnd, Fault: string(DelayWrite), Op: op, Key: key, Fence: tok.Fence, Current: out.Current,
				Err: errString(err), Value: boolInt(out.Applied)})
		}()
		time.Sleep(w.cfg.TTL / 4)
		w.record(Event{Kind: WriteFail, Op: op, Key: key, Fence: tok.Fence, Owner: tok.Owner, Err: "no reply in time; outcome unknown"})
		return
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	out, err := w.res.Append(wctx, key, tok, prev, w.cfg.Fencing, w.cfg.Worker, op)
	cancel()
	switch {
	case err != nil:
		w.record(Event{Kind: WriteFail, Op: op, Key: key, Fence: tok.Fence, Owner: tok.Owner, Err: errString(err)})
	case out.Applied:
		w.record(Event{Kind: WriteOK, Op: op, Key: key, Fence: tok.Fence, Owner: tok.Owner, Value: prev + 1})
	default:
		w.record(Event{Kind: WriteRefused, Op: op, Key: key, Fence: tok.Fence, Owner: tok.Owner, Current: out.Current})
	}
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// holding is a lock a worker holds: a fenced lease, or a Locker's lock.
type holding struct {
	// tok is the lease's token; for a Locker's lock, its fence is zero
	// (the checker derives one) and its owner is unique to the grant.
	tok fence.Token
	// ctx ends when the worker learns the lock is lost.
	ctx    context.Context
	cancel context.CancelFunc
	unlock func(context.Context) error
	// check is the careful worker's lease check before its write: for a
	// fenced lease, Lease.Err, which reads the clock (after a SIGCONT the
	// validity timer may not have fired yet); for a Locker's lock, ctx.
	check func() error
}

// acquire takes key with fenced or with the worker's Locker; op names the
// grant's owner for a Locker.
func (w *worker) acquire(ctx context.Context, key string, op int64) (*holding, error) {
	if w.locker == nil {
		l, err := w.client.Acquire(ctx, key, &fenced.LeaseOptions{TTL: w.cfg.TTL, MaxWait: fenced.WaitForever, MinFence: w.cfg.MinFence})
		if err != nil {
			return nil, err
		}
		lctx, cancel := context.WithCancel(l.Context())
		return &holding{tok: fence.From(l), ctx: lctx, cancel: cancel, unlock: l.Release, check: l.Err}, nil
	}
	u, err := w.locker.Lock(ctx, key, w.cfg.TTL)
	if err != nil {
		return nil, err
	}
	tok := fence.Token{Key: key, Owner: fmt.Sprintf("%s-%d", w.cfg.Locker, op)}
	lctx, cancel := context.WithCancelCause(context.Background())
	if lost := u.Lost(); lost != nil {
		go func() {
			select {
			case <-lost:
				w.record(Event{Kind: Lost, Key: key, Owner: tok.Owner})
				cancel(errors.New("the lock library reported the lock lost"))
			case <-lctx.Done():
			}
		}()
	}
	return &holding{tok: tok, ctx: lctx, cancel: func() { cancel(nil) }, unlock: u.Unlock, check: lctx.Err}, nil
}

func (w *worker) release(l *holding) {
	tok := l.tok
	w.record(Event{Kind: ReleaseInvoke, Key: tok.Key, Fence: tok.Fence, Owner: tok.Owner})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := l.unlock(ctx)
	w.record(Event{Kind: ReleaseDone, Key: tok.Key, Fence: tok.Fence, Owner: tok.Owner, Err: errString(err)})
}

// atPoint carries out a fault the nemesis armed for this worker (or any
// worker) at point: an arming file "arm-<point>[-w<N>]" holding "<fault>
// <action> [arg]". The worker that renames the file first takes it. Actions:
// stop (SIGSTOP itself; the nemesis continues it), kill (SIGKILL itself),
// hold (wait until the nemesis removes "holding-w<N>"), delay <duration>
// (returned: the write is delayed by it). The fault lands at the same
// moment of the protocol on every run, instead of by chance.
func (w *worker) atPoint(point string) (delay time.Duration) {
	for _, name := range []string{fmt.Sprintf("arm-%s-w%d", point, w.cfg.Worker), "arm-" + point} {
		path := filepath.Join(w.cfg.Dir, name)
		taken := fmt.Sprintf("%s.taken.%d.%d", path, w.pid, w.seq.Load())
		if os.Rename(path, taken) != nil {
			continue
		}
		raw, err := os.ReadFile(taken)
		if err != nil {
			continue
		}
		f := strings.Fields(string(raw))
		if len(f) < 2 {
			continue
		}
		fault, action := f[0], f[1]
		switch action {
		case "stop":
			w.record(Event{Kind: FaultStart, Fault: fault})
			// Returns once continued: the stop reaches this thread
			// asynchronously, so a bare SIGSTOP could let the write
			// run first under load.
			supervise.StopSelf()
		case "kill":
			w.record(Event{Kind: FaultStart, Fault: fault})
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // not reached
		case "hold":
			holding := filepath.Join(w.cfg.Dir, fmt.Sprintf("holding-w%d", w.cfg.Worker))
			if err := os.WriteFile(holding, nil, 0o644); err == nil {
				w.record(Event{Kind: Held, Fault: fault})
				for {
					if _, err := os.Stat(holding); errors.Is(err, os.ErrNotExist) {
						break
					}
					time.Sleep(2 * time.Millisecond)
				}
			}
		case "delay":
			if len(f) == 3 {
				if d, err := time.ParseDuration(f[2]); err == nil {
					w.record(Event{Kind: FaultStart, Fault: fault})
					return d
				}
			}
		}
		return 0
	}
	return 0
}

// waitGate waits, before the worker starts a round, while the nemesis
// keeps it out of the race for the key (the file "gate-w<N>": see
// holdAcross), or until the run stops.
func (w *worker) waitGate() {
	gate := gatePath(w.cfg.Dir, w.cfg.Worker)
	for {
		if _, err := os.Stat(gate); errors.Is(err, os.ErrNotExist) {
			return
		}
		if _, err := os.Stat(filepath.Join(w.cfg.Dir, stopFile)); err == nil {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// gatePath is the file that keeps worker w from starting a round.
func gatePath(dir string, w int) string { return filepath.Join(dir, fmt.Sprintf("gate-w%d", w)) }

// removeHolding lets a worker held with "hold" go on.
func removeHolding(dir string, w int) {
	os.Remove(filepath.Join(dir, fmt.Sprintf("holding-w%d", w)))
}
