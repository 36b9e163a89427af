package fenced

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fenced-dev/fenced/driver"
)

// maxRenewers bounds the renewal requests a batch sends at once to a driver
// without driver.BatchRenewer, so a client with many leases neither starts
// a goroutine per lease nor floods its store.
const maxRenewers = 64

// renewBatch renews batch, most urgent first (the leases whose validity
// ends soonest): in calls of up to maxBatchGrants grants to a
// driver.BatchRenewer, up to maxBatchCalls of them at a time, or with up to
// maxRenewers single renewals at a time. Calls of bounded size keep a slow
// or failed call from holding up, or failing, every lease of a client at
// once, and still give a store that renews many grants in one request
// thousands at a time.
func (r *renewer) renewBatch(batch []*Lease) {
	began := r.c.now()
	items := make([]renewal, len(batch))
	for i, l := range batch {
		l.mu.Lock()
		items[i] = renewal{l: l, until: l.validUntil}
		l.mu.Unlock()
	}
	slices.SortFunc(items, func(a, b renewal) int { return cmp.Compare(a.until, b.until) })
	if br := r.c.ops().BatchRenewer; br != nil && len(items) > 1 {
		calls := (len(items) + maxBatchGrants - 1) / maxBatchGrants
		inParallel(min(calls, maxBatchCalls), calls, func(i int) {
			r.renewCall(br, began, items[i*maxBatchGrants:min((i+1)*maxBatchGrants, len(items))])
		})
		return
	}
	ctx, cancel := r.renewContext(items[len(items)-1].until)
	defer cancel()
	inParallel(min(len(items), maxRenewers), len(items), func(i int) {
		l := items[i].l
		sent := r.c.now()
		if l.applyRenew(began, sent, r.c.drv.Renew(ctx, l.grant())) {
			r.reschedule(l)
		}
	})
}

// renewal is a lease to renew and the end of its validity when its renewal
// began.
type renewal struct {
	l     *Lease
	until time.Duration
}

// Batched renewal: at most maxBatchGrants grants per driver.BatchRenewer
// call, and at most maxBatchCalls calls at a time.
const (
	maxBatchGrants = 4096
	maxBatchCalls  = 4
)

// renewCall renews items, sorted by validity, in one call to br, as part
// of a batch that began at began.
func (r *renewer) renewCall(br driver.BatchRenewer, began time.Duration, items []renewal) {
	ctx, cancel := r.renewContext(items[len(items)-1].until)
	defer cancel()
	grants := make([]driver.Grant, len(items))
	for i, it := range items {
		grants[i] = it.l.grant()
	}
	sent := r.c.now()
	errs, err := br.RenewBatch(ctx, grants)
	if err == nil && len(errs) != len(grants) {
		err = fmt.Errorf("%w: the driver's RenewBatch returned %d results for %d grants", ErrUnknownOutcome, len(errs), len(grants))
	}
	kept := make([]*Lease, 0, len(items))
	for i, it := range items {
		e := err
		if e == nil {
			e = errs[i]
		}
		if it.l.applyRenew(began, sent, e) {
			kept = append(kept, it.l)
		}
	}
	r.reschedule(kept...)
}

// renewContext bounds renewal requests for leases whose validity ends by
// until at the latest: a renewal confirmed after that is useless, so a
// request may take that long (but at least a little), and no longer.
func (r *renewer) renewContext(until time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.ctx, max(until-r.c.now(), 50*time.Millisecond))
}

// inParallel calls fn(i) for every i in [0, n) on workers goroutines.
func inParallel(workers, n int, fn func(i int)) {
	var (
		wg   sync.WaitGroup
		next atomic.Int64
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				fn(i)
			}
		}()
	}
	wg.Wait()
}
