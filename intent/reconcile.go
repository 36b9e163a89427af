package intent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fence"
)

// Finding is what the provider says about an idempotency key.
type Finding int

const (
	// Unknown: the provider could not tell (an error, a timeout). The
	// intent stays submitting and is looked at again next run.
	Unknown Finding = iota
	// Done: the provider performed the side effect; Answer.Ref is its
	// reference. The intent becomes submitted.
	Done
	// Rejected: the provider received the request and refused it for good;
	// Answer.Reason says why. The intent becomes failed.
	Rejected
	// Absent: the provider has no record of the key. The intent returns to
	// pending, and the next attempt sends the same key, so a lost attempt
	// that arrives late is still deduplicated.
	Absent
)

// String names the finding.
func (f Finding) String() string {
	switch f {
	case Unknown:
		return "unknown"
	case Done:
		return "done"
	case Rejected:
		return "rejected"
	case Absent:
		return "absent"
	}
	return fmt.Sprintf("Finding(%d)", int(f))
}

// Answer is a provider's answer to a lookup.
type Answer struct {
	Finding Finding
	Ref     string
	Reason  string
}

// Lookup asks the provider about it.IdempotencyKey. It must not perform the
// side effect. An error is treated as Unknown.
type Lookup func(ctx context.Context, it Intent) (Answer, error)

// Reconciler resolves intents stuck in submitting, whose attempt's outcome
// is unknown because the worker crashed, timed out or lost its lease before
// recording it.
//
// For each intent submitting for longer than StuckFor, it takes the same
// lease the workers take (LeaseKey). It skips intents whose lease is held:
// their worker is still active. It claims the intent with its fence, so a
// late record from the old attempt is refused as stale. Then it asks Lookup
// and records the answer. It never calls the provider's side effect itself.
type Reconciler struct {
	Store *Store
	// Leases issues the leases the workers use.
	Leases *fenced.Client
	// LeaseKey maps an intent id to the lease key workers take for it.
	LeaseKey func(id string) string
	// StuckFor is how long an intent must have been submitting before it is
	// looked up: longer than the provider call's timeout plus the lease TTL.
	StuckFor time.Duration
	// Lookup asks the provider.
	Lookup Lookup
	// LeaseOptions for the reconciler's leases; nil means the client's
	// defaults. MaxWait is ignored: held intents are skipped.
	LeaseOptions *fenced.LeaseOptions
	// Limit caps the intents examined per run; 0 means 100.
	Limit int
}

// Report counts what one run did.
type Report struct {
	Examined, Submitted, Failed, Reopened int
	// Skipped: the lease was held, a newer holder had claimed the intent, or
	// it was no longer submitting.
	Skipped int
	// Unknown: the provider could not tell; looked at again next run.
	Unknown int
}

func (r *Reconciler) check() error {
	switch {
	case r.Store == nil || r.Leases == nil || r.Lookup == nil || r.LeaseKey == nil:
		return errors.New("intent: Reconciler needs Store, Leases, LeaseKey and Lookup")
	case r.StuckFor <= 0:
		return fmt.Errorf("intent: Reconciler.StuckFor must be positive, got %v", r.StuckFor)
	}
	return nil
}

// RunOnce examines the intents stuck right now, at most Limit of them:
// those examined longest ago first (see Store.Stuck). Every intent it
// examines is marked, whatever the outcome, so successive runs rotate
// through all stuck intents. Errors from individual intents are joined
// into the returned error; the run continues past them.
func (r *Reconciler) RunOnce(ctx context.Context) (Report, error) {
	var rep Report
	if err := r.check(); err != nil {
		return rep, err
	}
	stuck, err := r.Store.Stuck(ctx, r.StuckFor, r.Limit)
	if err != nil {
		return rep, err
	}
	var errs []error
	for _, it := range stuck {
		rep.Examined++
		if err := r.one(ctx, it.ID, &rep); err != nil {
			errs = append(errs, err)
		}
	}
	return rep, errors.Join(errs...)
}

// Run calls RunOnce every period until ctx ends, reporting each run's
// error to onErr (which may be nil).
func (r *Reconciler) Run(ctx context.Context, every time.Duration, onErr func(error)) error {
	if err := r.check(); err != nil {
		return err
	}
	if every <= 0 {
		return fmt.Errorf("intent: Run period must be positive, got %v", every)
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if _, err := r.RunOnce(ctx); err != nil && onErr != nil && ctx.Err() == nil {
			onErr(err)
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-t.C:
		}
	}
}

func (r *Reconciler) one(ctx context.Context, id string, rep *Report) error {
	// Whatever happens next (lease held, lookup unknown, an error), the
	// intent goes behind the others in the next Stuck, so that a few
	// intents that never resolve cannot hold the whole batch.
	if err := r.Store.markChecked(ctx, id); err != nil {
		return err
	}
	lease, err := r.Leases.TryAcquire(ctx, r.LeaseKey(id), r.LeaseOptions)
	if errors.Is(err, fenced.ErrHeld) {
		rep.Skipped++
		return nil
	}
	if err != nil {
		return fmt.Errorf("intent: reconcile %q: %w", id, err)
	}
	defer lease.Release(context.WithoutCancel(ctx))
	tok := fence.From(lease)
	res, err := r.Store.Claim(lease.Context(), nil, id, tok)
	if err != nil {
		return fmt.Errorf("intent: reconcile: %w", err)
	}
	if res.Outcome == fence.Stale {
		rep.Skipped++
		return nil
	}
	it, err := r.Store.Get(lease.Context(), id)
	if err != nil {
		return err
	}
	if it.State != Submitting {
		rep.Skipped++
		return nil
	}
	ans, lerr := r.Lookup(lease.Context(), it)
	if lerr != nil {
		ans = Answer{Finding: Unknown}
	}
	switch ans.Finding {
	case Done:
		err = r.Store.Complete(lease.Context(), id, tok, ans.Ref)
		if err == nil {
			rep.Submitted++
		}
	case Rejected:
		err = r.Store.Fail(lease.Context(), id, tok, ans.Reason)
		if err == nil {
			rep.Failed++
		}
	case Absent:
		err = r.Store.Reopen(lease.Context(), id, tok)
		if err == nil {
			rep.Reopened++
		}
	default:
		rep.Unknown++
		if lerr != nil {
			return fmt.Errorf("intent: reconcile %q: lookup: %w", id, lerr)
		}
		return nil
	}
	if errors.Is(err, fenced.ErrStaleFence) || errors.Is(err, ErrNotSubmitting) {
		rep.Skipped++
		return nil
	}
	return err
}
