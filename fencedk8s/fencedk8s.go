// Package fencedk8s lets client-go's leader election
// (k8s.io/client-go/tools/leaderelection) elect on any fenced store instead
// of a Kubernetes Lease object: ResourceLock implements
// resourcelock.Interface, for leaderelection.RunOrDie and for
// controller-runtime's Options.LeaderElectionResourceLockInterface.
//
//	lock, err := fencedk8s.New(client, "my-controller", identity, &fencedk8s.Options{
//		RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second, // the elector's
//	})
//	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
//		Lock: lock, LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second,
//		RetryPeriod: 2 * time.Second, Callbacks: leaderelection.LeaderCallbacks{
//			OnStartedLeading: func(ctx context.Context) {
//				ctx, l := lock.LeaderContext(ctx) // work under ctx, write with l.Fence()
//				...
//
// # Who decides
//
// client-go's elector judges expiry by its own observation of the record
// and, as its documentation says, does not fence: a leader that was paused
// can act after another was elected. Here the fenced store decides. Update
// takes a fenced lease on the election's key, or renews it at the store:
// the elector's renewals are the lease's renewals, as they are the Lease
// object's on Kubernetes, so a lease whose elector stopped expires. It
// fails while another process holds the key, whatever the elector concluded
// from its clock. The lease's fence is the term's epoch (Epoch,
// Lease().Fence()): it strictly increases from leader to leader, so a
// resource that refuses older epochs refuses a deposed leader.
//
// # When a term ends
//
// The elector ends a term (cancels the context of OnStartedLeading) once
// its renewals have failed for RenewDeadline, counted from the start of its
// next round of renewals, which begins RetryPeriod after the last success.
// So Update succeeds only while the lease has at least RenewDeadline +
// RetryPeriod + a tenth of that left after the renewal, and the store keeps
// the lease for the record's LeaseDuration or 1.2 × (RenewDeadline +
// RetryPeriod), whichever is longer. Get and Update never wait on the store
// past the end of the lease's local validity, nor past their context. Then,
// when the leader's link to the store is cut, the elector ends its term
// before the store lets another candidate in, as long as the elector's
// timers are not late by more than that tenth. Options.RenewDeadline and
// RetryPeriod must therefore be the elector's; a lock that sees the
// elector give itself longer than RenewDeadline fails the renewal and says
// so.
//
// A leader that is paused (SIGSTOP, a long GC or VM pause) past the
// lease's validity comes back with the elector's context still live: the
// elector only ends it after RenewDeadline of failed renewals. The context
// from LeaderContext does not wait: it ends with the lease, and its Err
// reads the clock, so it already reports the end when the paused process
// runs again. Use it, and the fence, for the leader's work.
//
// # The leader's name
//
// The leader also holds a second lease on "<name>/holder/<fence>/<identity>"
// (so fenced ls and the dashboard show it), through which the other
// candidates' Get reports the leader by its identity, as client-go's
// OnNewLeader and logs show it. Until they find that key (or on a backend
// where it could not be taken) they name the leader "fenced:" and the first
// characters of its owner token, never the whole token.
package fencedk8s

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/fenced-dev/fenced"
)

// Options configure a ResourceLock. The zero value gives the defaults.
type Options struct {
	// Lease are the lease terms (zero fields take the client's defaults).
	// The lock sets TTL (see the package comment), MaxWait (zero: no wait) and
	// ManualRenew (the elector renews).
	Lease fenced.LeaseOptions
	// RenewDeadline and RetryPeriod are the elector's
	// (LeaderElectionConfig). Zero takes 10s and 2s, the defaults of
	// controller-runtime and of Kubernetes' own controllers. Longer values
	// than the elector's only make the lease longer; shorter ones would let
	// the elector's term outlive the lease, so a renewal whose context
	// gives it more than RenewDeadline fails (ErrTiming).
	RenewDeadline, RetryPeriod time.Duration
	// OnEvent, when set, receives what the elector records (RecordEvent):
	// "<identity> became leader", "<identity> stopped leading".
	OnEvent func(string)
}

// Defaults of Options.RenewDeadline and Options.RetryPeriod.
const (
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
)

// ErrTiming is what Update returns when a renewal cannot promise that the
// elector ends its term before the lease ends: the lease has too little
// left after the renewal, or the elector's RenewDeadline is longer than
// Options.RenewDeadline.
var ErrTiming = errors.New("fencedk8s: the elector could outlive the lease")

// ErrTermEnded is what Get and Update return while the elector still leads
// but the term's lease has ended (lost, expired or broken): the term cannot
// be renewed, and a new term starts only with a new campaign.
var ErrTermEnded = errors.New("fencedk8s: the term's lease has ended")

// ResourceLock is a resourcelock.Interface on a fenced Client, for one
// candidate (identity) of one election (name). It is safe for concurrent
// use.
type ResourceLock struct {
	c        *fenced.Client
	name     string
	identity string
	opts     Options

	mu sync.Mutex
	// lease is the lease this candidate holds (possibly ended), and rec
	// the record it was last granted or renewed for.
	lease *fenced.Lease
	rec   resourcelock.LeaderElectionRecord
	// leading is true between the elector's "became leader" and "stopped
	// leading" (RecordEvent): a term, bound to the lease it began with.
	leading bool
	// names caches the other leaders' identities (holder.go).
	names nameCache
}

var _ resourcelock.Interface = (*ResourceLock)(nil)

// New returns the lock of candidate identity for the election name (a
// fenced key) on c. It returns an error matching fenced.ErrInvalidKey,
// fenced.ErrInvalidOptions or fenced.ErrNoFence when name, identity or
// opts cannot be used: identity must be usable at the end of a key (see
// the package comment).
func New(c *fenced.Client, name, identity string, opts *Options) (*ResourceLock, error) {
	if c == nil {
		return nil, errors.New("fencedk8s: New: nil client")
	}
	if err := fenced.ValidateKey(name); err != nil {
		return nil, fmt.Errorf("fencedk8s: %w", err)
	}
	if identity == "" {
		return nil, errors.New("fencedk8s: identity is empty")
	}
	if err := fenced.ValidateKey(holderKey(name, ^uint64(0), identity)); err != nil {
		return nil, fmt.Errorf("fencedk8s: identity %q cannot name the leader's holder key: %w", identity, err)
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	switch {
	case o.RenewDeadline < 0:
		return nil, fmt.Errorf("fencedk8s: %w: RenewDeadline %v is negative", fenced.ErrInvalidOptions, o.RenewDeadline)
	case o.RetryPeriod < 0:
		return nil, fmt.Errorf("fencedk8s: %w: RetryPeriod %v is negative", fenced.ErrInvalidOptions, o.RetryPeriod)
	}
	if o.RenewDeadline == 0 {
		o.RenewDeadline = DefaultRenewDeadline
	}
	if o.RetryPeriod == 0 {
		o.RetryPeriod = DefaultRetryPeriod
	}
	o.Lease.MaxWait = 0
	o.Lease.ManualRenew = true
	o.Lease.RenewEvery = 0
	check := o.Lease
	check.TTL = ttlFor(o, 0)
	if _, err := c.Resolve(&check); err != nil {
		return nil, fmt.Errorf("fencedk8s: election %q: %w", name, err)
	}
	return &ResourceLock{c: c, name: name, identity: identity, opts: o}, nil
}

// raw is what Get returns as the record's bytes: it changes with every new
// grant, so the elector sees each change of leader.
type raw struct {
	Holder string `json:"holder"`
	Fence  uint64 `json:"fence"`
}

// live returns the lease this candidate holds, or nil. r.mu must be held.
func (r *ResourceLock) live() *fenced.Lease {
	if r.lease != nil && r.lease.Err() != nil {
		return nil
	}
	return r.lease
}

// termErr is ErrTermEnded with the lease's end cause. r.mu must be held.
func (r *ResourceLock) termErr() error {
	if r.lease == nil {
		return fmt.Errorf("%w: election %q", ErrTermEnded, r.name)
	}
	return fmt.Errorf("%w: election %q: %w", ErrTermEnded, r.name, r.lease.Err())
}

// Get returns the election's record: this candidate's own while it holds
// the lease, otherwise the store's holder (named by its identity, see the
// package comment), or a record with no holder when the key is free. While
// the elector leads on a lease that has ended, it returns ErrTermEnded
// without asking the store.
func (r *ResourceLock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	r.mu.Lock()
	if l := r.live(); l != nil {
		rec := r.rec
		r.mu.Unlock()
		b, err := json.Marshal(raw{Holder: r.identity, Fence: l.Fence()})
		return &rec, b, err
	}
	if r.leading {
		err := r.termErr()
		r.mu.Unlock()
		return nil, nil, err
	}
	r.mu.Unlock()
	ctx, cancel := r.bound(ctx, r.opts.RenewDeadline)
	defer cancel()
	info, err := r.c.Inspect(ctx, r.name)
	if err != nil && !errors.Is(err, fenced.ErrNotFound) {
		return nil, nil, err
	}
	// A key never granted (ErrNotFound) is free: the record has no holder.
	rec := resourcelock.LeaderElectionRecord{LeaderTransitions: int(info.Fence)}
	if info.Held {
		rec.HolderIdentity = r.holderName(ctx, info)
		rec.LeaseDurationSeconds = int((info.Remaining + time.Second - 1) / time.Second)
	}
	b, err := json.Marshal(raw{Holder: rec.HolderIdentity, Fence: info.Fence})
	return &rec, b, err
}

// Create is Update: the key needs no creating.
func (r *ResourceLock) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	return r.Update(ctx, ler)
}

// Update takes the lease for ler.HolderIdentity (this candidate), or
// renews it at the store, and then checks that it has enough left for the
// elector to end its term in time (ErrTiming otherwise; see the package
// comment). It fails with fenced.ErrHeld while another candidate holds it,
// and with ErrTermEnded while the elector leads on a lease that has ended.
// A record with no holder (client-go's ReleaseOnCancel) releases the lease
// without waiting for a store that does not answer.
func (r *ResourceLock) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	switch ler.HolderIdentity {
	case "":
		return r.release(ctx)
	case r.identity:
	default:
		return fmt.Errorf("fencedk8s: candidate %q cannot write a record for %q", r.identity, ler.HolderIdentity)
	}
	r.mu.Lock()
	l, leading := r.live(), r.leading
	if l == nil && leading {
		err := r.termErr()
		r.mu.Unlock()
		return err
	}
	r.mu.Unlock()
	if err := r.checkDeadline(ctx, leading); err != nil {
		return err
	}
	fresh := l == nil
	if fresh {
		opts := r.opts.Lease
		opts.TTL = ttlFor(r.opts, ler.LeaseDurationSeconds)
		actx, cancel := r.bound(ctx, opts.TTL)
		var err error
		l, err = r.c.TryAcquire(actx, r.name, &opts)
		cancel()
		if err != nil {
			return err
		}
	} else {
		// A renewal answered after the lease's validity is worth nothing.
		rctx, cancel := context.WithTimeout(ctx, l.Remaining())
		err := l.Renew(rctx)
		cancel()
		if err != nil {
			return err
		}
	}
	if err := r.checkRemaining(l); err != nil {
		if fresh {
			r.drop(l)
		}
		return err
	}
	r.mu.Lock()
	r.lease = l
	r.rec = ler
	r.rec.LeaderTransitions = int(l.Fence())
	r.mu.Unlock()
	if fresh {
		go r.takeHolderKey(l)
	}
	return nil
}

// bound returns ctx with a deadline no later than d from now: the elector
// gives its campaign's calls none.
func (r *ResourceLock) bound(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}

// drop releases l, which the elector will not be told of, waiting no
// longer than its validity.
func (r *ResourceLock) drop(l *fenced.Lease) {
	ctx, cancel := context.WithTimeout(context.Background(), l.Remaining())
	defer cancel()
	_ = l.Release(ctx)
}

// release ends the lease this candidate holds, if any (client-go's
// ReleaseOnCancel): its context at once, then the grant at the store. It
// returns once the lease's context has ended, or with the release's error
// if the store answers first: the elector ends its term only after this
// call, so it does not wait for a store that does not answer. The grant is
// freed in the background, waited for no longer than the lease's validity,
// after which the store frees it anyway.
func (r *ResourceLock) release(ctx context.Context) error {
	r.mu.Lock()
	l := r.lease
	r.lease = nil
	r.mu.Unlock()
	if l == nil || l.Err() != nil {
		return nil
	}
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.Remaining())
		defer cancel()
		done <- l.Release(ctx)
	}()
	select {
	case err := <-done:
		return err
	case <-l.Context().Done():
		return nil
	}
}

// RecordEvent passes s to Options.OnEvent. It also follows the elector's
// terms: client-go records "became leader" when a term begins and
// "stopped leading" when it ends.
func (r *ResourceLock) RecordEvent(s string) {
	r.mu.Lock()
	switch s {
	case "became leader":
		r.leading = true
	case "stopped leading":
		r.leading = false
	}
	r.mu.Unlock()
	if r.opts.OnEvent != nil {
		r.opts.OnEvent(r.identity + " " + s)
	}
}

// Identity returns the candidate's identity.
func (r *ResourceLock) Identity() string { return r.identity }

// Describe names the election.
func (r *ResourceLock) Describe() string { return "fenced/" + r.name }

// Lease returns the lease this candidate holds as leader, or nil.
func (r *ResourceLock) Lease() *fenced.Lease {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.live()
}

// Epoch returns the current term's fence, or zero when this candidate does
// not lead.
func (r *ResourceLock) Epoch() uint64 {
	if l := r.Lease(); l != nil {
		return l.Fence()
	}
	return 0
}
