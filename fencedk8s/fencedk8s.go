// Package fencedk8s lets client-go's leader election
// (k8s.io/client-go/tools/leaderelection) elect on any fenced store instead
// of a Kubernetes Lease object: ResourceLock implements
// resourcelock.Interface, for leaderelection.RunOrDie and for
// controller-runtime's Options.LeaderElectionResourceLockInterface.
//
//	lock, err := fencedk8s.New(client, "my-controller", identity, nil)
//	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
//		Lock: lock, LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second,
//		RetryPeriod: 2 * time.Second, Callbacks: callbacks,
//	})
//
// # Who decides
//
// client-go's elector judges expiry by its own observation of the record
// and, as its documentation says, does not fence: a leader that was paused
// can act after another was elected. Here the fenced store decides. Update
// takes (or keeps) a fenced lease on the election's key, with the record's
// LeaseDurationSeconds as its TTL, renewed by fenced in the background. It
// fails while another process holds it, whatever the elector concluded from
// its clock. The lease's fence is the term's epoch (Epoch, and
// Lease().Fence()): it strictly increases from leader to leader, so a
// resource that refuses older epochs refuses a deposed leader. The lease's
// context (Lease().Context()) ends the moment fenced counts the lease lost,
// up to RenewDeadline before the elector calls OnStoppedLeading.
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
	// Lease are the lease terms (nil fields inherit the client's defaults);
	// TTL is replaced by each record's LeaseDurationSeconds and MaxWait is
	// NoWait.
	Lease fenced.LeaseOptions
	// OnEvent, when set, receives what the elector records (RecordEvent):
	// "<identity> became leader", "<identity> stopped leading".
	OnEvent func(string)
}

// ResourceLock is a resourcelock.Interface on a fenced Client, for one
// candidate (identity) of one election (name). It is safe for concurrent
// use.
type ResourceLock struct {
	c        *fenced.Client
	name     string
	identity string
	opts     Options

	mu    sync.Mutex
	lease *fenced.Lease
	rec   resourcelock.LeaderElectionRecord
}

var _ resourcelock.Interface = (*ResourceLock)(nil)

// New returns the lock of candidate identity for the election name (a
// fenced key) on c. It returns an error matching driver.ErrInvalidKey,
// fenced.ErrInvalidOptions or fenced.ErrNoFence when name or opts cannot
// be used.
func New(c *fenced.Client, name, identity string, opts *Options) (*ResourceLock, error) {
	if err := fenced.ValidateKey(name); err != nil {
		return nil, fmt.Errorf("fencedk8s: %w", err)
	}
	if identity == "" {
		return nil, errors.New("fencedk8s: identity is empty")
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	o.Lease.MaxWait = fenced.NoWait
	if _, err := c.Resolve(&o.Lease); err != nil {
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

// live returns the lease this candidate holds, or nil.
func (r *ResourceLock) live() *fenced.Lease {
	if r.lease != nil && r.lease.Err() != nil {
		r.lease = nil
	}
	return r.lease
}

// Get returns the election's record: this candidate's own while it holds
// the lease, otherwise the store's holder (named by its fenced owner
// token), or a record with no holder when the key is free.
func (r *ResourceLock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	r.mu.Lock()
	if l := r.live(); l != nil {
		rec := r.rec
		r.mu.Unlock()
		b, err := json.Marshal(raw{Holder: r.identity, Fence: l.Fence()})
		return &rec, b, err
	}
	r.mu.Unlock()
	info, err := r.c.Inspect(ctx, r.name)
	if err != nil && !errors.Is(err, fenced.ErrNotFound) {
		return nil, nil, err
	}
	// A key never granted (ErrNotFound) is free: the record has no holder.
	rec := resourcelock.LeaderElectionRecord{LeaderTransitions: int(info.Fence)}
	if info.Held {
		rec.HolderIdentity = "fenced:" + info.Owner
		rec.LeaseDurationSeconds = int((info.Remaining + time.Second - 1) / time.Second)
	}
	b, err := json.Marshal(raw{Holder: rec.HolderIdentity, Fence: info.Fence})
	return &rec, b, err
}

// Create is Update: the key needs no creating.
func (r *ResourceLock) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	return r.Update(ctx, ler)
}

// Update takes the lease for ler.HolderIdentity (this candidate) with
// ler.LeaseDurationSeconds as TTL, or checks that it still holds it (fenced
// renews it in the background); it fails with fenced.ErrHeld while another
// candidate holds it. A record with no holder (client-go's
// ReleaseOnCancel) releases the lease.
func (r *ResourceLock) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch ler.HolderIdentity {
	case "":
		if r.lease == nil {
			return nil
		}
		l := r.lease
		r.lease = nil
		return l.Release(ctx)
	case r.identity:
	default:
		return fmt.Errorf("fencedk8s: candidate %q cannot write a record for %q", r.identity, ler.HolderIdentity)
	}
	if l := r.live(); l != nil {
		r.rec.RenewTime = ler.RenewTime
		return nil
	}
	opts := r.opts.Lease
	opts.TTL = time.Duration(ler.LeaseDurationSeconds) * time.Second
	l, err := r.c.TryAcquire(ctx, r.name, &opts)
	if err != nil {
		return err
	}
	r.lease = l
	r.rec = ler
	r.rec.LeaderTransitions = int(l.Fence())
	return nil
}

// RecordEvent passes s to Options.OnEvent.
func (r *ResourceLock) RecordEvent(s string) {
	if r.opts.OnEvent != nil {
		r.opts.OnEvent(s)
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
