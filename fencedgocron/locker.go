package fencedgocron

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/fenced-dev/fenced"
)

// Locker is a gocron.Locker on a fenced Client. Each run of a job takes a
// lease on KeyPrefix + the job's name. A run whose key another instance
// holds is skipped. Give the job's task with Locker.Task so that it gets
// that lease. It is safe for concurrent use.
type Locker struct {
	c      *fenced.Client
	prefix string
	opts   fenced.LeaseOptions

	mu sync.Mutex
	// unclaimed holds, per job context, the locks granted to runs whose
	// task has not yet taken its lease, oldest first.
	unclaimed map[context.Context][]*Lock
	// holding counts the releases waiting out a minimum hold; idle is
	// closed while it is zero (see Wait).
	holding int
	idle    chan struct{}
}

var _ gocron.Locker = (*Locker)(nil)

// NewLocker returns a Locker taking leases from c with opts (nil: the
// defaults). It returns an error when c is nil, and one matching
// fenced.ErrInvalidOptions or fenced.ErrNoFence when the lease terms cannot
// be used on c's backend.
func NewLocker(c *fenced.Client, opts *Options) (*Locker, error) {
	if c == nil {
		return nil, errNilClient
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.KeyPrefix == "" {
		o.KeyPrefix = DefaultKeyPrefix
	}
	o.Lease.MaxWait = 0
	if o.Lease.MinHold == 0 {
		o.Lease.MinHold = DefaultMinHold
	}
	if _, err := c.Resolve(&o.Lease); err != nil {
		return nil, fmt.Errorf("fencedgocron: %w", err)
	}
	idle := make(chan struct{})
	close(idle)
	return &Locker{c: c, prefix: o.KeyPrefix, opts: o.Lease, unclaimed: map[context.Context][]*Lock{}, idle: idle}, nil
}

// Wait waits until every lease this Locker keeps for its minimum hold has
// been released, or ctx ends (it then returns ctx's error). Call it after
// the scheduler's Shutdown and before closing the Client: Close would
// release those leases at once, and an instance whose tick comes a little
// later would run the same tick again. It waits about MinHold, plus the
// release's round trip (at most the Client's CloseTimeout).
func (lk *Locker) Wait(ctx context.Context) error {
	lk.mu.Lock()
	idle := lk.idle
	lk.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// held counts a release that waits out its minimum hold. lk.mu must be
// held.
func (lk *Locker) held() {
	if lk.holding == 0 {
		lk.idle = make(chan struct{})
	}
	lk.holding++
}

// unheld counts a release out of its hold.
func (lk *Locker) unheld() {
	lk.mu.Lock()
	defer lk.mu.Unlock()
	if lk.holding--; lk.holding == 0 {
		close(lk.idle)
	}
}

// Lock takes the lease on the job named key, or fails (matching
// fenced.ErrHeld when another instance holds it), in which case gocron
// skips this run. ctx is the job's context, which gocron also passes to the
// task: a task made with Task finds the lease through it.
func (lk *Locker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	if unnamed(key) {
		return nil, ErrUnnamedJob
	}
	l, err := lk.c.TryAcquire(ctx, lk.prefix+key, &lk.opts)
	if err != nil {
		return nil, fmt.Errorf("fencedgocron: job %q: %w", key, err)
	}
	lock := &Lock{lk: lk, ctx: ctx, lease: l, granted: time.Now()}
	lk.mu.Lock()
	lk.unclaimed[ctx] = append(lk.unclaimed[ctx], lock)
	lk.mu.Unlock()
	return lock, nil
}

// claim hands the oldest lock granted for the job context ctx to a task,
// or returns nil when there is none. Each lock goes to one task only: runs
// of one job that overlap on this instance (possible only once the older
// run's lease was lost) may swap leases, never share one.
func (lk *Locker) claim(ctx context.Context) *Lock {
	lk.mu.Lock()
	defer lk.mu.Unlock()
	q := lk.unclaimed[ctx]
	if len(q) == 0 {
		return nil
	}
	lock := q[0]
	lk.dequeue(lock)
	lock.running = true
	return lock
}

// dequeue takes lock off its context's unclaimed list, if it is there.
// lk.mu must be held.
func (lk *Locker) dequeue(lock *Lock) {
	q := lk.unclaimed[lock.ctx]
	for i, l := range q {
		if l == lock {
			q = append(q[:i:i], q[i+1:]...)
			break
		}
	}
	if len(q) == 0 {
		delete(lk.unclaimed, lock.ctx)
	} else {
		lk.unclaimed[lock.ctx] = q
	}
}

// Lock is one run's lease. The job gets it through Locker.Task.
type Lock struct {
	lk      *Locker
	ctx     context.Context
	lease   *fenced.Lease
	granted time.Time

	// Guarded by lk.mu.
	running  bool // a task runs under the lease
	unlocked bool // gocron has called Unlock
	released bool // the release has started
}

// Lease returns the lease behind the lock.
func (l *Lock) Lease() *fenced.Lease { return l.lease }

// Unlock releases the lease once its minimum hold has passed and no task
// runs under it, in the background, and returns at once. ctx ending (gocron
// cancels it when the job is removed or the scheduler stops) does not cut
// the hold short: another instance's late tick must still find the key
// held. Closing the Client does (see Locker.Wait).
func (l *Lock) Unlock(ctx context.Context) error {
	l.lk.mu.Lock()
	l.lk.dequeue(l)
	l.unlocked = true
	release := l.releasable()
	l.lk.mu.Unlock()
	if release {
		go l.release(ctx)
	}
	return nil
}

// done is called when the task that ran under the lease returns.
func (l *Lock) done() {
	l.lk.mu.Lock()
	l.running = false
	release := l.releasable()
	l.lk.mu.Unlock()
	if release {
		go l.release(l.ctx)
	}
}

// releasable reports, once, that the lease may be released: gocron has
// unlocked it and no task runs under it. It counts the release's hold
// (Locker.Wait). lk.mu must be held.
func (l *Lock) releasable() bool {
	if !l.unlocked || l.running || l.released {
		return false
	}
	l.released = true
	l.lk.held()
	return true
}

// release frees the lease after its minimum hold, which only the lease's
// end (the Client closing) cuts short.
func (l *Lock) release(ctx context.Context) {
	defer l.lk.unheld()
	l.lease.HoldAtLeast(context.WithoutCancel(ctx), l.granted)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.lk.c.Options().CloseTimeout)
	defer cancel()
	_ = l.lease.Release(rctx) // on failure the lease expires after its TTL
}
