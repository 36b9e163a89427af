package fencedgocron

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/recipe"
)

// ErrNotLeader is what Elector.IsLeader returns on an instance that does
// not lead, and what a task made with Elector.Task returns there.
var ErrNotLeader = errors.New("fencedgocron: this instance is not the leader")

// Elector is a gocron.Elector on a fenced Election: it campaigns in the
// background until its context ends, and IsLeader reports whether this
// instance leads now.
type Elector struct {
	mu   sync.Mutex
	lead *recipe.Leadership
	done chan struct{}
}

var _ gocron.Elector = (*Elector)(nil)

// NewElector campaigns for the election name on c until ctx ends (then it
// resigns). opts.Lease are the leadership's lease terms; KeyPrefix is not
// used (name is the key). It returns an error when c is nil, name is not a
// valid key or the lease terms cannot be used on c's backend.
func NewElector(ctx context.Context, c *fenced.Client, name string, opts *Options) (*Elector, error) {
	if c == nil {
		return nil, errNilClient
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	e, err := recipe.NewElection(c, name, &o.Lease)
	if err != nil {
		return nil, fmt.Errorf("fencedgocron: %w", err)
	}
	el := &Elector{done: make(chan struct{})}
	go el.campaign(ctx, e)
	return el, nil
}

func (el *Elector) campaign(ctx context.Context, e *recipe.Election) {
	defer close(el.done)
	for ctx.Err() == nil {
		ld, err := e.Campaign(ctx, "")
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			t := time.NewTimer(time.Second)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
			continue
		}
		el.mu.Lock()
		el.lead = ld
		el.mu.Unlock()
		select {
		case <-ld.Context().Done():
		case <-ctx.Done():
		}
		el.mu.Lock()
		el.lead = nil
		el.mu.Unlock()
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = ld.Release(rctx)
		cancel()
	}
}

// leadership returns the current term, or nil when this instance does not
// lead.
func (el *Elector) leadership() *recipe.Leadership {
	el.mu.Lock()
	defer el.mu.Unlock()
	if el.lead == nil || el.lead.Err() != nil {
		return nil
	}
	return el.lead
}

// IsLeader returns nil while this instance leads, ErrNotLeader otherwise.
func (el *Elector) IsLeader(context.Context) error {
	if el.leadership() == nil {
		return ErrNotLeader
	}
	return nil
}

// Epoch returns the current term's epoch (its lease's fence, which strictly
// increases from term to term), or zero when this instance does not lead.
func (el *Elector) Epoch() uint64 {
	el.mu.Lock()
	defer el.mu.Unlock()
	if el.lead == nil {
		return 0
	}
	return el.lead.Fence()
}

// Task returns a gocron task that runs fn with the lease of the current
// term. fn's context ends when the term ends, when the job is removed or
// when the scheduler shuts down. A term's end has a cause matching
// fenced.ErrLost or fenced.ErrExpired, or fenced.ErrReleased when the
// campaign stopped. Send the lease's fence (the term's epoch) with every
// write (fence.From). A lost term is known only when the store says so or
// the lease's local validity ends. By then another instance may lead.
//
// When this instance does not lead as the run starts, fn does not run. The
// task then returns ErrNotLeader (gocron skips such runs anyway when the
// scheduler has this Elector). Otherwise it returns fn's error, or a
// *fenced.LeaseEndedError if the term ended before fn returned, as
// Locker.Task does.
func (el *Elector) Task(fn func(ctx context.Context, l *fenced.Lease) error) gocron.Task {
	if fn == nil {
		return gocron.NewTask(nil) // NewJob refuses it
	}
	return gocron.NewTask(func(ctx context.Context) error {
		ld := el.leadership()
		if ld == nil {
			return ErrNotLeader
		}
		return runUnder(ctx, ld.Lease, fn)
	})
}

// Done is closed when the campaign has stopped (its context ended) and the
// last term was resigned.
func (el *Elector) Done() <-chan struct{} { return el.done }
